"""The entry's head for every session it is the entry of: final norm, lm_head, sampling and
the next step's input embedding. Sessions whose steps came back while the compute thread was
busy share one product with the head (a fifth of a small model's weights), as a hop's decode
steps share one forward."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from swarm.api.backend import TokenLogprob
from swarm.config import SpeculationConfig
from swarm.errors import SwarmError
from swarm.inference.batching import ComputeBatcher
from swarm.inference.drafting import DraftCounts, DraftLength, DraftSource
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.draft_model import DraftModel
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.sampling import Sampler, top_logprobs
from swarm.types import SessionId

_SMOOTHING = 0.2  # weight of the newest batch in the moving average of the head's cost


@dataclass(frozen=True)
class HeadJob:
    session: SessionId
    sampler: Sampler
    hidden: torch.Tensor  # the last hop's output for the step, [1, seq, hidden]
    history: Sequence[int]  # every token of the sequence so far


@dataclass(frozen=True)
class Sampled:
    token: int
    next_input: torch.Tensor  # the token's embedding, the next step's input [1, 1, hidden]
    logprob: TokenLogprob | None  # where the request asked for logprobs


@dataclass(frozen=True)
class Pick:
    """One token a verify step chose, and its logprobs where asked."""

    token: int
    logprob: TokenLogprob | None


class EntryHead:
    def __init__(
        self,
        entry: EntryModel,
        compute: ComputeThread,
        max_batch: int = 1,
        speculation: SpeculationConfig | None = None,
        draft_model: DraftModel | None = None,
    ) -> None:
        """`speculation`: how its sessions draft (by default, as SpeculationConfig's
        defaults); `draft_model`: the model that drafts where a lookup finds nothing."""
        # compute-thread ms of the head per session step (a batch's wall time over its jobs),
        # a moving average; 0 until a batch has run. Routing counts it as this node's own work.
        self.ms_per_session = 0.0
        self.speculation = speculation or SpeculationConfig()
        self.drafts = DraftCounts()  # every session's, for status and metrics
        self.draft_model = draft_model
        # the draft model's length as the last finished session left it: the next starts there
        self.model_drafting: DraftLength | None = None
        self._entry = entry
        self._compute = compute

        def sample(jobs: list[HeadJob]) -> list[Sampled | SwarmError]:
            started = time.perf_counter()
            results = _sample_batch(entry, jobs)
            self._observe((time.perf_counter() - started) * 1000 / len(jobs))
            return results

        self.batcher = ComputeBatcher(compute, sample, _session_of, max_batch)

    def _observe(self, ms: float) -> None:
        last = self.ms_per_session
        self.ms_per_session = ms if last == 0.0 else last + _SMOOTHING * (ms - last)

    async def sample(self, job: HeadJob) -> Sampled:
        return await self.batcher.run(job)

    async def verify(
        self, job: HeadJob, drafts: Sequence[int], source: DraftSource = "lookup"
    ) -> list[Pick]:
        """A verify step's tokens: the target's own choice at each position, with the
        request's whole sampler, while it equals the draft there, then the first one that
        differs (or the one after the last draft). One sampler call per token kept, so a
        seeded request draws what it would draw without drafts. Runs alone, not batched
        with other sessions' heads."""
        picks = await self._compute.run(_verify_rows, self._entry, job, drafts)
        self.drafts.add(len(drafts), len(picks) - 1, source)
        return picks


def _session_of(job: HeadJob) -> str:
    return job.session


def _sample_batch(entry: EntryModel, jobs: list[HeadJob]) -> list[Sampled | SwarmError]:
    """Runs on the compute thread: one product with the head for all jobs, then each job's
    own sampling (its penalties, seed and logprobs)."""
    logits = entry.last_logits([job.hidden for job in jobs])
    results: list[Sampled | SwarmError] = []
    for row, job in zip(logits, jobs, strict=True):
        try:
            results.append(_sample_one(entry, job, row))
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


def _verify_rows(entry: EntryModel, job: HeadJob, drafts: Sequence[int]) -> list[Pick]:
    """Runs on the compute thread. job.hidden: [1, 1 + len(drafts), hidden], row i the
    output at the position of the i-th draft's predecessor."""
    logits = entry.row_logits(job.hidden)
    tokens = list(job.history)
    picks: list[Pick] = []
    for i, row in enumerate(logits):
        token = job.sampler.next_token(row, tokens)
        picks.append(Pick(token, _logprob(entry, job.sampler, row, token)))
        if i == len(drafts) or token != drafts[i] or token in entry.eos_token_ids:
            break
        tokens.append(token)
    return picks
