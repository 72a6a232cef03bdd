"""The entry's head for every session it is the entry of: final norm, lm_head, sampling and
the next step's input embedding. Sessions whose steps came back while the compute thread was
busy share one product with the head (a fifth of a small model's weights), as a hop's decode
steps share one forward; a verify step's rows join it where the head's kernel computes rows
alone (`EntryModel.rows_logits`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch

from swarm.api.backend import TokenLogprob
from swarm.config import SpeculationConfig
from swarm.errors import ModelError, SwarmError
from swarm.inference.batching import ComputeBatcher
from swarm.inference.drafting import DraftCounts, DraftLength, DraftSource
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.draft_model import DraftModel
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.sampling import Sampler, top_logprobs
from swarm.types import SessionId
from swarm.wire import ResultMessage

_SMOOTHING = 0.2  # weight of the newest batch in the moving average of the head's cost


@dataclass(frozen=True)
class HeadJob:
    session: SessionId
    sampler: Sampler
    hidden: torch.Tensor  # the last hop's output for the step, [1, seq, hidden]
    history: Sequence[int]  # every token of the sequence so far
    # a verify step's drafted tokens (hidden holds one row more): its rows are sampled while
    # they equal these; None: a plain step, one token sampled from the last position
    drafts: tuple[int, ...] | None = None


@dataclass(frozen=True)
class EmbedJob:
    """A verify step's input: the newest token and the drafts after it, to embed."""

    session: SessionId
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Sampled:
    token: int
    next_input: torch.Tensor  # the token's embedding, the next step's input [1, 1, hidden]
    logprob: TokenLogprob | None  # where the request asked for logprobs
    # ms the head took on the compute thread where it ran as the step's result arrived
    # (None: it ran when the generation asked)
    ran_ms: float | None = None
    # perf_counter when it finished there, where the next step leaves from there at once
    # (ahead.py): when that step began
    sampled_at: float | None = None


@dataclass(frozen=True)
class _Armed:
    """A plain decode step's head, ready to run on its result: what sampling it needs."""

    sampler: Sampler
    history: Sequence[int]
    # the tokens after which the generation does not go on with a plain step (None: after
    # none it surely does); after any other but an end of text, that step may leave from
    # here as soon as the token is sampled (ahead.py)
    stops_after: frozenset[int] | None = None


@dataclass(frozen=True)
class Pick:
    """One token a verify step chose, and its logprobs where asked."""

    token: int
    logprob: TokenLogprob | None


@dataclass(frozen=True)
class Verified:
    """What a verify step's rows chose: the tokens kept, in order."""

    picks: tuple[Pick, ...]


class EntryHead:
    def __init__(
        self,
        entry: EntryModel,
        compute: ComputeThread,
        max_batch: int = 1,
        speculation: SpeculationConfig | None = None,
        draft_model: DraftModel | None = None,
        claim: Callable[[str, int], bool] | None = None,
    ) -> None:
        """`speculation`: how its sessions draft (by default, as SpeculationConfig's
        defaults); `draft_model`: the model that drafts where a lookup finds nothing.
        `claim(session, step)`: whether the entry still awaits that step (StepWaiters), where
        the compute thread runs a plain decode step's head as soon as the step's result
        reaches it (`claims`, `run_claimed`) instead of handing the result to the event loop,
        which would hand it back for the head: two wake-ups fewer a token. None: the head
        runs where the generation asks for it."""
        # compute-thread ms of the head per session step (a batch's wall time over its jobs,
        # verify steps' among them), a moving average; 0 until a batch has run. Routing counts
        # it as this node's own work.
        self.ms_per_session = 0.0
        self.speculation = speculation or SpeculationConfig()
        self.drafts = DraftCounts()  # every session's, for status and metrics
        self.draft_model = draft_model
        # the draft model's length as the last finished session left it: the next starts there
        self.model_drafting: DraftLength | None = None

        def sample(jobs: list[HeadJob]) -> list[Sampled | Verified | SwarmError]:
            started = time.perf_counter()
            results = _sample_batch(entry, jobs)
            self._observe((time.perf_counter() - started) * 1000 / len(jobs))
            return results

        self.batcher: ComputeBatcher[HeadJob, Sampled | Verified] = ComputeBatcher(
            compute, sample, _session_of, max_batch
        )

        def embed(jobs: list[EmbedJob]) -> list[torch.Tensor | SwarmError]:
            return [entry.embed(list(job.tokens)) for job in jobs]

        # sessions that draft at the same step embed their drafts in one job: one job each
        # took the thread in turn with the verify steps already posted, so eight sessions'
        # verify steps ran one at a time, 15 ms apart
        self.embeds: ComputeBatcher[EmbedJob, torch.Tensor] = ComputeBatcher(
            compute, embed, _session_of, max_batch
        )
        self._entry = entry
        self._claim = claim
        self._armed: dict[str, _Armed] = {}  # sessions whose next result the thread samples
        self._ran: dict[str, Sampled | SwarmError] = {}  # what it sampled, until asked for
        self.thread_batches = 0  # products the compute thread ran so as results arrived
        self.thread_steps = 0  # the sessions' steps they carried

    def arm(
        self,
        session: SessionId,
        sampler: Sampler,
        history: Sequence[int],
        stops_after: frozenset[int] | None = None,
    ) -> bool:
        """Before a plain decode step is sent: its head may run where its result arrives.
        `stops_after`: the tokens after which the generation would not go on with a plain
        step (None: it may not go on after any). False where this head does not run there."""
        if self._claim is None:
            return False
        self._armed[session] = _Armed(sampler, history, stops_after)
        return True

    def disarm(self, session: SessionId) -> None:
        """The step's result came, or it failed (a replay's results are not sampled there)."""
        self._armed.pop(session, None)

    def forget(self, session: SessionId) -> None:
        self._armed.pop(session, None)
        self._ran.pop(session, None)

    def claims(self, result: ResultMessage) -> bool:
        """On the compute thread: whether it runs the head on `result` (then the step is
        claimed: its waiter takes it whatever the deadline)."""
        armed = self._armed.get(result.session)
        return (
            self._claim is not None
            and armed is not None
            and not result.verify
            # the step armed for: a step sent ahead may come back before the generation
            # took the token before it (then the generation samples it, with that token)
            and result.position == len(armed.history) - 1
            and self._claim(result.session, result.step)
        )

    def run_claimed(self, results: Sequence[ResultMessage]) -> list[tuple[ResultMessage, Sampled]]:
        """On the compute thread: the heads of claimed results, one product for all. Returns
        the results whose session goes on with a plain step from the token sampled (its
        embedding is that step's input)."""
        started = time.perf_counter()
        jobs, sampled, stops = [], [], []
        for result in results:
            armed = self._armed.get(result.session)
            if armed is None:  # its request ended meanwhile
                continue
            session = SessionId(result.session)
            jobs.append(HeadJob(session, armed.sampler, result.hidden, armed.history))
            sampled.append(result)
            stops.append(armed.stops_after)
        if not jobs:
            return []
        outcomes = _sample_batch(self._entry, jobs)
        sampled_at = time.perf_counter()
        ms = (sampled_at - started) * 1000 / len(jobs)
        self.thread_batches += 1
        self.thread_steps += len(jobs)
        self._observe(ms)
        going_on = []
        ends = self._entry.eos_token_ids
        for result, outcome, stop in zip(sampled, outcomes, stops, strict=True):
            if isinstance(outcome, Sampled):
                outcome = dataclasses.replace(outcome, ran_ms=ms)
                if stop is not None and outcome.token not in stop and outcome.token not in ends:
                    outcome = dataclasses.replace(outcome, sampled_at=sampled_at)
                    going_on.append((result, outcome))
            self._ran[result.session] = cast(Sampled | SwarmError, outcome)
        return going_on

    def _observe(self, ms: float) -> None:
        last = self.ms_per_session
        self.ms_per_session = ms if last == 0.0 else last + _SMOOTHING * (ms - last)

    async def sample(self, job: HeadJob) -> Sampled:
        ran = self._ran.pop(job.session, None)
        if isinstance(ran, SwarmError):
            raise ran
        if ran is not None:
            return ran
        result = await self.batcher.run(dataclasses.replace(job, drafts=None))
        if not isinstance(result, Sampled):
            raise ModelError("the head verified a plain step")
        return result

    async def embed(self, session: SessionId, tokens: Sequence[int]) -> torch.Tensor:
        """The input of a verify step, `tokens` embedded [1, len, hidden], with the other
        sessions' that ask meanwhile."""
        return await self.embeds.run(EmbedJob(session, tuple(tokens)))

    async def verify(
        self, job: HeadJob, drafts: Sequence[int], source: DraftSource = "lookup"
    ) -> list[Pick]:
        """A verify step's tokens: the target's own choice at each position, with the
        request's whole sampler, while it equals the draft there, then the first one that
        differs (or the one after the last draft). One sampler call per token kept, so a
        seeded request draws what it would draw without drafts. Batched with other
        sessions' heads, each row the logits it would have alone."""
        result = await self.batcher.run(dataclasses.replace(job, drafts=tuple(drafts)))
        if not isinstance(result, Verified):
            raise ModelError("the head sampled a verify step as a plain one")
        self.drafts.add(len(drafts), len(result.picks) - 1, source)
        return list(result.picks)


def _session_of(job: HeadJob | EmbedJob) -> str:
    return job.session


def _sample_batch(entry: EntryModel, jobs: list[HeadJob]) -> list[Sampled | Verified | SwarmError]:
    """Runs on the compute thread: one product with the head for all jobs (a verify step's
    rows among them where the head computes rows alone), then each job's own sampling (its
    penalties, seed and logprobs)."""
    logits = entry.rows_logits(
        [job.hidden if job.drafts is not None else job.hidden[:, -1:] for job in jobs]
    )
    results: list[Sampled | Verified | SwarmError] = []
    for rows, job in zip(logits, jobs, strict=True):
        try:
            if job.drafts is None:
                results.append(_sample_one(entry, job, rows[-1]))
            else:
                results.append(Verified(_verify_rows(entry, job, job.drafts, rows)))
        except SwarmError as e:
            results.append(e)
    return results


def _sample_one(entry: EntryModel, job: HeadJob, logits: torch.Tensor) -> Sampled:
    token = job.sampler.next_token(logits, job.history)
    return Sampled(token, entry.embed([token]), _logprob(entry, job.sampler, logits, token))


def _logprob(
    entry: EntryModel, sampler: Sampler, logits: torch.Tensor, token: int
) -> TokenLogprob | None:
    n = sampler.params.logprobs
    if n is None:
        return None
    chosen, top = top_logprobs(logits, token, n)
    top_text = tuple((entry.token_text(i), lp) for i, lp in top)
    return TokenLogprob(entry.token_text(token), chosen, top_text)


def _verify_rows(
    entry: EntryModel, job: HeadJob, drafts: Sequence[int], logits: torch.Tensor
) -> tuple[Pick, ...]:
    """Runs on the compute thread. logits: [1 + len(drafts), vocab], row i the logits at the
    position of the i-th draft's predecessor."""
    tokens = list(job.history)
    picks: list[Pick] = []
    for i, row in enumerate(logits):
        token = job.sampler.next_token(row, tokens)
        picks.append(Pick(token, _logprob(entry, job.sampler, row, token)))
        if i == len(drafts) or token != drafts[i] or token in entry.eos_token_ids:
            break
        tokens.append(token)
    return tuple(picks)
