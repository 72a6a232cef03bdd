"""The entry's generation loop: prefill, then one token at a time until a stop condition,
streaming text as it becomes final."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from swarm.api.backend import Done, TokenLogprob
from swarm.errors import HopFailedError
from swarm.inference.drafting import DraftSource, Speculation
from swarm.inference.head import EntryHead, HeadJob, Pick
from swarm.inference.pipeline import Pipeline
from swarm.inference.text_stream import TextStream
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.sampling import Sampler
from swarm.runtime.text.grammar import TokenConstraint
from swarm.sampling_settings import SamplingSettings
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


async def generate(
    entry: EntryModel,
    pipeline: Pipeline,
    compute: ComputeThread,
    prompt_ids: Sequence[int],
    params: SamplingSettings,
    session: SessionId | None = None,
    head: EntryHead | None = None,
    constraint: TokenConstraint | None = None,
) -> AsyncIterator[Chunk | Done]:
    """Yield a Chunk per generated token, then one Done. The session is closed on every
    hop before the Done (which carries its trace), or when the iterator ends otherwise.
    `head`: the entry's head shared by its sessions (batched); by default one for this
    generation alone. `constraint` is params.grammar compiled for the entry's vocabulary,
    where one is asked."""
    if not prompt_ids:
        raise ValueError("the prompt has no tokens")
    if params.max_tokens is None:  # the service bounds it by the context; a caller must too
        raise ValueError("max_tokens must be set before generating")
    parts = _Parts(entry, pipeline, compute, head or EntryHead(entry, compute))
    turns = await _Turns.start(parts, prompt_ids, params, session, constraint)
    try:
        picks = await turns.prefill()
        while True:
            for pick in picks:
                chunks, ending = turns.accept(pick)
                for chunk in chunks:
                    yield chunk
                if ending is not None:
                    yield await turns.finish(ending)
                    return
            await turns.prepare_next()  # the newest token, and drafts where there are some
            picks = await (turns.verify_turn() if turns.drafts else turns.decode_turn())
    finally:
        await turns.close()


@dataclass(frozen=True)
class _Parts:
    """What every turn of a generation runs on."""

    entry: EntryModel
    pipeline: Pipeline
    compute: ComputeThread
    head: EntryHead  # shared by the entry's sessions: their heads run batched


@dataclass
class _Turns:
    """One generation's state from turn to turn: the text so far, the next step's input and
    position, and what drafting carries to the next step. The first turn prefills the prompt
    (`prefill`); each turn keeps the tokens its step picked (`accept`), then sets up the next
    step's input and drafts (`prepare_next`) and runs it, a plain decode step (`decode_turn`)
    or a verify step (`verify_turn`). `finish` ends the text; `close` frees the session."""

    parts: _Parts
    session: SessionId
    prompt_tokens: int
    max_tokens: int
    sampler: Sampler
    text: TextStream
    speculation: Speculation | None
    history: list[int]  # the prompt and every kept token
    cache_prompt: bool  # start from the prompt blocks the hops keep (params.cache_prompt)
    hidden: torch.Tensor  # the next step's input, embedded: first the whole prompt
    generated: list[int] = field(default_factory=list)
    position: int = 0  # where the next step starts: the hops hold every token before it
    room: int = 0  # tokens the generation may still take after the next step's
    drafts: list[int] = field(default_factory=list)  # what the next step verifies after its input
    source: DraftSource = "lookup"  # where they came from
    drafting_ms: float = 0.0  # what making them took (the draft model's steps)
    verified: bool = False  # the last step verified drafts
    cached: int = 0  # prompt positions that came from blocks the hops kept
    sampled_at: float | None = None  # where the last token was sampled on the compute thread
    closed: bool = False

    @classmethod
    async def start(
        cls,
        parts: _Parts,
        prompt_ids: Sequence[int],
        params: SamplingSettings,
        session: SessionId | None,
        constraint: TokenConstraint | None,
    ) -> _Turns:
        head = parts.head
        speculation = (
            Speculation(head.speculation, head.draft_model is not None, head.model_drafting)
            if head.speculation.enabled and params.speculate
            else None
        )
        max_tokens = params.max_tokens or 0
        prompt = await parts.compute.run(parts.entry.embed, prompt_ids)
        return cls(
            parts,
            session or SessionId(uuid.uuid4().hex),
            len(prompt_ids),
            max_tokens,
            Sampler(params, len(prompt_ids), constraint),
            TextStream(parts.entry, params.stop),
            speculation,
            list(prompt_ids),
            params.cache_prompt,
            prompt,
            room=max_tokens,
        )

    async def prefill(self) -> list[Pick]:
        """The first step: the whole prompt through every layer (from the blocks the hops
        keep, where the request lets it), and the token sampled after it."""
        out = await self._run_step(None, self._checked())
        return [await self._sample(out, decoding=False)]

    async def decode_turn(self) -> list[Pick]:
        """A plain decode step: the newest token through every layer, and one token sampled
        where the result arrives."""
        # a plain step sent ahead from where the last token was sampled began there
        began = _began(time.perf_counter(), False, self.sampled_at)
        # a checked step's result is compared before the head may sample it
        checked = self._checked()
        out = await (self._run_step(None, checked) if checked else self._armed_step())
        self.verified = False
        picks = [await self._sample(out, decoding=True)]
        self._observe(began, picks)
        return picks

    async def _armed_step(self) -> torch.Tensor:
        """A plain decode step, its head armed where the result arrives (head.py), so the
        next plain step may leave from there (ahead.py)."""
        head = self.parts.head
        armed = head.arm(self.session, self.sampler, self.history, self._stops_after())
        try:
            return await self._run_step(head if armed else None, False)
        finally:
            if armed:
                head.disarm(self.session)

    def _stops_after(self) -> frozenset[int] | None:
        return _stops_after(self.speculation, self.history, self.room)

    async def prepare_next(self) -> None:
        """The next step's position and input: the newest token, and the drafts to verify
        after it where a lookup or the draft model has some."""
        self.position = len(self.history) - 1  # the hops hold every token before the newest
        # the newest token and the drafts may all be kept: never past max_tokens
        self.room = self.max_tokens - len(self.generated) - 1
        self.drafts, self.source, self.drafting_ms = [], "lookup", 0.0
        if self.speculation is not None:
            await self._propose(self.speculation)
        if self.drafts or self.verified:  # else the head embedded the token with its batch
            tokens = [self.history[-1], *self.drafts]
            self.hidden = await self.parts.head.embed(self.session, tokens)

    async def _propose(self, speculation: Speculation) -> None:
        """Drafts for the next step: a lookup's, else the draft model's where the
        speculation wants some (the source stays "model" where it proposes none)."""
        self.drafts = speculation.drafts(self.history, self.room)
        wanted = 0 if self.drafts else speculation.model_drafts(self.room)
        draft_model = self.parts.head.draft_model
        if wanted and draft_model is not None:
            proposal = await self.parts.compute.run(
                draft_model.propose, self.session, self.history, wanted
            )
            self.drafts, self.source = proposal.tokens, "model"
            self.drafting_ms = proposal.drafting_ms

    async def verify_turn(self) -> list[Pick]:
        """The newest token and the drafts after it as one verify step: the drafts the
        sampler agrees with and the first token it does not. A replay returns one position:
        its token is sampled as a plain step's."""
        began = time.perf_counter()  # a step with drafts leaves now
        out = await self._run_step(None, self._checked())
        if out.shape[1] != len(self.drafts) + 1:  # replayed, or run plainly
            self.parts.head.drafts.unverified += 1
            self.drafts = []
        self.verified = bool(self.drafts)
        if self.verified:
            self.sampled_at = None
            job = HeadJob(self.session, self.sampler, out, self.history)
            picks = await self.parts.head.verify(job, self.drafts, self.source)
        else:
            picks = [await self._sample(out, decoding=True)]
        self._observe(began, picks)
        return picks

    def _observe(self, began: float, picks: list[Pick]) -> None:
        """What a decode or verify step cost and kept, for the draft length."""
        if self.speculation is not None:
            step_ms = (time.perf_counter() - began) * 1000 + self.drafting_ms
            self.speculation.observe(len(self.drafts), len(picks) - 1, step_ms, self.source)

    async def _sample(self, out: torch.Tensor, decoding: bool) -> Pick:
        heading = time.perf_counter()
        job = HeadJob(self.session, self.sampler, out, self.history)
        sampled = await self.parts.head.sample(job)
        self.hidden, self.sampled_at = sampled.next_input, sampled.sampled_at
        pipeline = self.parts.pipeline
        if decoding and sampled.ran_ms is not None:  # ran as the result arrived
            pipeline.record_head(self.session, sampled.ran_ms, within_step=True)
        elif decoding:
            pipeline.record_head(self.session, (time.perf_counter() - heading) * 1000)
        return Pick(sampled.token, sampled.logprob)

    def accept(self, pick: Pick) -> tuple[list[Chunk], FinishReason | None]:
        """Keep one picked token: the chunks it releases, and why the generation ends with
        it, if it does (an end of text is not kept)."""
        if pick.token in self.parts.entry.eos_token_ids:
            return self._tail(), "stop"
        self.history.append(pick.token)
        self.generated.append(pick.token)
        delta, stopped = self.text.push(self.generated)
        chunks = [Chunk(pick.token, delta, pick.logprob)]
        if stopped:
            return chunks, "stop"
        if len(self.generated) >= self.max_tokens:
            return chunks + self._tail(), "length"
        return chunks, None

    def _tail(self) -> list[Chunk]:
        """The text held back (a possible stop string's start, a partial character)."""
        tail = self.text.flush()
        return [Chunk(None, tail)] if tail else []

    async def finish(self, reason: FinishReason) -> Done:
        self.closed, trace = True, await self.parts.pipeline.close(self.session)
        generated = len(self.generated)
        return Done(reason, self.prompt_tokens, generated, trace, self.cached, self.text.hit)

    async def close(self) -> None:
        """However the generation ended: the session's caches freed everywhere."""
        head, speculation = self.parts.head, self.speculation
        head.forget(self.session)
        if speculation is not None:
            if speculation.model_length is not None:
                head.model_drafting = speculation.model_length
            length = speculation.length
            log.debug(
                "session %s drafting: plain step %s ms, %s ms per drafted position",
                self.session,
                length.plain_ms,
                length.per_row_ms,
            )
        if not self.closed:
            await self.parts.pipeline.close(self.session)
        if head.draft_model is not None:
            await self.parts.compute.run(head.draft_model.close, self.session)

    def _checked(self) -> bool:
        return self.parts.pipeline.spot_checked(self.session, self.position)

    async def _run_step(self, armed: EntryHead | None, checked: bool) -> torch.Tensor:
        """Run the next step; when a hop fails, let the pipeline route around it and replay
        every token so far (`_attempt`). The output's last position is the same bits either
        way. `armed`: the head armed to run on the step's result where it arrives; a
        replay's results come here instead. `checked`: the step is spot-checked before its
        output is returned (never with `armed`); a hop found wrong fails it as a failed hop
        does."""
        started, replaying = time.monotonic(), False
        for attempt in range(_MAX_RECOVERIES + 1):
            try:
                out = await self._attempt(replaying)
                if checked and not replaying:
                    await self._spot_check(out)
            except HopFailedError as e:
                if armed is not None:
                    armed.disarm(self.session)
                if attempt == _MAX_RECOVERIES:
                    raise
                replaying = True
                log.warning(
                    "session %s: hop %s failed (%s); re-routing and replaying %d tokens",
                    self.session,
                    e.node_id,
                    e,
                    len(self.history),
                )
                await asyncio.sleep(_RECOVERY_BACKOFF_S * attempt)  # views catch up after a move
                await self.parts.pipeline.recover(self.session, e.node_id)  # NoRouteError: none
                continue
            if replaying:  # the step's whole time is the stall the client saw
                stall_ms = 1000 * (time.monotonic() - started)
                log.info("session %s re-routed; the stream stalled %.0f ms", self.session, stall_ms)
            return out
        raise AssertionError("unreachable")

    def _attempt(self, replaying: bool) -> Awaitable[torch.Tensor]:
        """One try at the next step: the prompt, a decode or verify step, or after a failed
        hop every token so far from position 0 (the history, whose last token is the step's
        input), the prompt as it was prefilled and the rest as decode rows
        (`Pipeline.replay`). A step with drafts returns each position; a replay drops them
        (one position comes back). A plain function: a decode step awaits the pipeline's
        own coroutine, with no frame of its own."""
        if replaying:
            return self._replay_history()
        if self.position == 0:  # the prompt
            return self._prefill_prompt()
        verify = bool(self.drafts)
        return self.parts.pipeline.forward(self.session, self.hidden, self.position, verify)

    async def _prefill_prompt(self) -> torch.Tensor:
        ids = self.history if self.cache_prompt else None
        prefilled = await self.parts.pipeline.prefill(self.session, self.hidden, ids)
        self.cached = prefilled.cached
        return prefilled.hidden

    async def _spot_check(self, out: torch.Tensor) -> None:
        """Compare the step's last position with other holders' (`Pipeline.spot_check`): the
        tokens up to it are the prompt (a prefill), or the history and the drafts the step
        returned a position for."""
        tokens = [*self.history, *self.drafts]
        if self.position:
            tokens = tokens[: self.position + out.shape[1]]
        everything = await self.parts.compute.run(self.parts.entry.embed, tokens)
        await self.parts.pipeline.spot_check(
            self.session, everything, self.prompt_tokens, out[:, -1:]
        )

    async def _replay_history(self) -> torch.Tensor:
        entry, pipeline = self.parts.entry, self.parts.pipeline
        everything = await self.parts.compute.run(entry.embed, self.history)
        return await pipeline.replay(self.session, everything, self.prompt_tokens)


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
