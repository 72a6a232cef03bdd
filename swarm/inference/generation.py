"""The entry's generation loop: prefill, then one token at a time until a stop condition,
streaming text as it becomes final."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from swarm.api.backend import TokenLogprob
from swarm.errors import HopFailedError
from swarm.inference.drafting import DraftSource, Speculation
from swarm.inference.head import EntryHead, HeadJob, Pick
from swarm.inference.pipeline import Pipeline
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.sampling import Sampler
from swarm.runtime.text.grammar import TokenConstraint
from swarm.sampling_settings import SamplingSettings
from swarm.schema import RequestTrace
from swarm.types import SessionId

FinishReason = Literal["stop", "length"]
_MAX_RECOVERIES = 3  # re-routes per step before the request fails
_RECOVERY_BACKOFF_S = 0.5  # seconds times the attempt number, from the second re-route on
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chunk:
    """One generated token (None for held-back text released at the end) and the text that
    became final with it (may be empty)."""

    token_id: int | None
    text: str
    logprob: TokenLogprob | None = None  # where the request asked for logprobs


@dataclass(frozen=True)
class Finish:
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    trace: RequestTrace | None = None  # where a networked pipeline sent the session


async def generate(
    entry: EntryModel,
    pipeline: Pipeline,
    compute: ComputeThread,
    prompt_ids: Sequence[int],
    params: SamplingSettings,
    session: SessionId | None = None,
    head: EntryHead | None = None,
    constraint: TokenConstraint | None = None,
) -> AsyncIterator[Chunk | Finish]:
    """Yield a Chunk per generated token, then one Finish. The session is closed on every
    hop before the Finish (which carries its trace), or when the iterator ends otherwise.
    `head`: the entry's head shared by its sessions (batched); by default one for this
    generation alone. `constraint` is params.grammar compiled for the entry's vocabulary,
    where one is asked."""
    if not prompt_ids:
        raise ValueError("the prompt has no tokens")
    if params.max_tokens is None:  # the service bounds it by the context; a caller must too
        raise ValueError("max_tokens must be set before generating")
    max_tokens = params.max_tokens
    session = session or SessionId(uuid.uuid4().hex)
    head = head or EntryHead(entry, compute)
    sampler = Sampler(params, len(prompt_ids), constraint)
    text = _TextStream(entry, params.stop)
    history = list(prompt_ids)
    generated: list[int] = []
    draft_model = head.draft_model
    speculation = (
        Speculation(head.speculation, draft_model is not None, head.model_drafting)
        if head.speculation.enabled and params.speculate
        else None
    )
    drafts: list[int] = []  # what this step verifies after its first token
    source: DraftSource = "lookup"  # where they came from
    drafting_ms = 0.0  # what making them took (the draft model's steps)
    closed = False
    try:
        hidden = await compute.run(entry.embed, history)
        position = 0
        room = max_tokens  # tokens the generation may still take after this step's
        sampled_at: float | None = None  # where the last token was sampled on the thread
        while True:
            decoding = position > 0
            # a plain step sent ahead from where the last token was sampled began there
            began = _began(time.perf_counter(), bool(drafts), sampled_at)
            # a plain decode step's head may run where its result arrives (head.py), and the
            # next plain step leave from there (ahead.py)
            armed = (
                decoding
                and not drafts
                and head.arm(session, sampler, history, _stops_after(speculation, history, room))
            )
            try:
                out = await _run_step(
                    pipeline,
                    compute,
                    entry,
                    session,
                    hidden,
                    position,
                    history,
                    len(prompt_ids),
                    bool(drafts),
                    head if armed else None,
                )
            finally:
                if armed:
                    head.disarm(session)
            if drafts and out.shape[1] != len(drafts) + 1:  # replayed, or a hop ran it plainly
                head.drafts.unverified += 1
                drafts = []
            heading = time.perf_counter()
            job = HeadJob(session, sampler, out, history)
            verified = bool(drafts)
            if verified:
                picks, sampled_at = await head.verify(job, drafts, source), None
            else:
                sampled = await head.sample(job)
                picks, hidden = [Pick(sampled.token, sampled.logprob)], sampled.next_input
                sampled_at = sampled.sampled_at
                if decoding and sampled.ran_ms is not None:  # ran as the result arrived
                    pipeline.record_head(session, sampled.ran_ms, within_step=True)
                elif decoding:
                    pipeline.record_head(session, (time.perf_counter() - heading) * 1000)
            if speculation is not None and decoding:
                step_ms = (time.perf_counter() - began) * 1000 + drafting_ms
                speculation.observe(len(drafts), len(picks) - 1, step_ms, source)
            for pick in picks:
                if pick.token in entry.eos_token_ids:
                    tail = text.flush()
                    if tail:
                        yield Chunk(None, tail)
                    closed, trace = True, await pipeline.close(session)
                    yield Finish("stop", len(prompt_ids), len(generated), trace)
                    return
                history.append(pick.token)
                generated.append(pick.token)
                delta, stopped = text.push(generated)
                yield Chunk(pick.token, delta, pick.logprob)
                if stopped or len(generated) >= max_tokens:
                    if not stopped:
                        tail = text.flush()
                        if tail:
                            yield Chunk(None, tail)
                    closed, trace = True, await pipeline.close(session)
                    reason: FinishReason = "stop" if stopped else "length"
                    yield Finish(reason, len(prompt_ids), len(generated), trace)
                    return
            position = len(history) - 1  # the hops hold every token before the newest
            # the newest token and the drafts may all be kept: never past max_tokens
            room = max_tokens - len(generated) - 1
            drafts, source, drafting_ms = [], "lookup", 0.0
            if speculation is not None:
                drafts = speculation.drafts(history, room)
                wanted = 0 if drafts else speculation.model_drafts(room)
                if wanted and draft_model is not None:
                    proposal = await compute.run(draft_model.propose, session, history, wanted)
                    drafts, source, drafting_ms = proposal.tokens, "model", proposal.drafting_ms
            if drafts or verified:  # else the head embedded the token with its batch
                hidden = await head.embed(session, [history[-1], *drafts])
    finally:
        head.forget(session)
        if speculation is not None:
            if speculation.model_length is not None:
                head.model_drafting = speculation.model_length
            length = speculation.length
            log.debug(
                "session %s drafting: plain step %s ms, %s ms per drafted position",
                session,
                length.plain_ms,
                length.per_row_ms,
            )
        if not closed:
            await pipeline.close(session)
        if draft_model is not None:
            await compute.run(draft_model.close, session)


def _began(now: float, drafts: bool, sampled_at: float | None) -> float:
    """When a step began, for what drafting measures: a plain step after a token sampled on
    the compute thread left from there (ahead.py) as the token was sampled, before this
    turn of the loop; a step with drafts leaves now."""
    return now if drafts or sampled_at is None else min(now, sampled_at)


def _stops_after(
    speculation: Speculation | None, history: Sequence[int], room: int
) -> frozenset[int] | None:
    """Before a plain step: the tokens after which the generation would not go on with a
    plain step (drafts would follow), or None where it would not go on after any (no room
    left for another token, or drafts may follow any). `room`: tokens it may take after
    this step's. An end of text and a stop string end it too; the head knows the first."""
    if room <= 0:
        return None
    if speculation is None:
        return frozenset()
    return speculation.drafting_tokens(history, room - 1)


async def _run_step(
    pipeline: Pipeline,
    compute: ComputeThread,
    entry: EntryModel,
    session: SessionId,
    hidden: torch.Tensor,
    position: int,
    history: Sequence[int],
    prefilled: int,
    verify: bool = False,
    armed: EntryHead | None = None,
) -> torch.Tensor:
    """Run one step; when a hop fails, let the pipeline route around it and replay every token
    so far (`history`, whose last token is this step's input) from position 0, the first
    `prefilled` (the prompt) as they were prefilled and the rest as decode rows
    (`Pipeline.replay`). The output's last position is the same bits either way. `verify`: a
    step of drafted tokens after the input, each position returned; a replay drops them (one
    position comes back). `armed`: the head armed to run on this step's result where it
    arrives; a replay's results come to the generation instead."""
    started, replaying = time.monotonic(), False
    for attempt in range(_MAX_RECOVERIES + 1):
        try:
            if replaying:
                everything = await compute.run(entry.embed, history)
                out = await pipeline.replay(session, everything, prefilled)
            else:
                out = await pipeline.forward(session, hidden, position, verify)
        except HopFailedError as e:
            if armed is not None:
                armed.disarm(session)
            if attempt == _MAX_RECOVERIES:
                raise
            replaying = True
            log.warning(
                "session %s: hop %s failed (%s); re-routing and replaying %d tokens",
                session,
                e.node_id,
                e,
                len(history),
            )
            await asyncio.sleep(_RECOVERY_BACKOFF_S * attempt)  # let views catch up after a move
            await pipeline.recover(session, e.node_id)  # NoRouteError: no route is left
        else:
            if replaying:  # the step's whole time is the stall the client saw
                stall_ms = 1000 * (time.monotonic() - started)
                log.info("session %s re-routed; the stream stalled %.0f ms", session, stall_ms)
            return out
    raise AssertionError("unreachable")


class _TextStream:
    """Turns the growing token list into text deltas: holds back an incomplete UTF-8 character
    and any tail that could still become a stop string.

    Each token costs the same however long the output grows: only a window of the newest
    tokens is decoded (from the start of the last cleanly decoded token on, so a tokenizer's
    handling of a word's first piece is the same in both decodes whose difference is taken),
    and stop strings are looked for only in the text not yet released, which a possible stop
    string's prefix and the newest token's text bound."""

    def __init__(self, entry: EntryModel, stop: Sequence[str]) -> None:
        self._entry = entry
        self._stop = tuple(stop)
        self._ids: Sequence[int] = ()
        self._start = 0  # tokens before this are text already, outside the window
        self._read = 0  # tokens decoded cleanly (no incomplete character at their end)
        self._taken = 0  # characters of the window's text already moved to _pending
        self._pending = ""  # text decoded but not released: it may begin a stop string

    def push(self, generated: Sequence[int]) -> tuple[str, bool]:
        """Returns (new final text, whether a stop string was hit)."""
        self._ids = generated
        self._pending += self._new_text()
        hits = [at for at in (self._pending.find(s) for s in self._stop) if at != -1]
        if hits:
            return self._release(min(hits)), True
        hold = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(self._pending)), hold, -1):
                if self._pending.endswith(stop[:size]):
                    hold = size
                    break
        return self._release(len(self._pending) - hold), False

    def _new_text(self) -> str:
        window = self._entry.decode(self._ids[self._start :])
        stable = window.rstrip("\ufffd")  # bytes of a character still to come
        new = window[self._taken : len(stable)] if len(stable) > self._taken else ""
        if len(stable) == len(window):  # decoded cleanly: slide the window up to here
            self._start, self._read = self._read, len(self._ids)
            self._taken = len(self._entry.decode(self._ids[self._start : self._read]))
        else:
            self._taken = max(self._taken, len(stable))
        return new

    def flush(self) -> str:
        window = self._entry.decode(self._ids[self._start :])
        return self._release(len(self._pending)) + window[self._taken :]

    def _release(self, end: int) -> str:
        out, self._pending = self._pending[:end], self._pending[end:]
        return out
