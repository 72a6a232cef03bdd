"""Continuous batching on the compute thread: jobs that arrive while it is busy wait together
and then run as one batched call, so each weight matrix is read once for all of them. A lone
job runs at once; nothing waits for a batch to fill.

Two batchers use it: a hop's decode and verify steps (one batched forward per span, every
position of a verify step a row of it) and the entry's head (one batched norm + lm_head
product for every session whose step came back, every row of a verify step's among them)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from swarm.errors import SpanError, SwarmError
from swarm.inference.prefill_order import WaitingChunk, next_batch
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.serving import Serving
from swarm.runtime.execution.shard import DecodeRun, Shard
from swarm.types import LayerSpan, SessionId
from swarm.wire import StepMessage

log = logging.getLogger(__name__)

Job = TypeVar("Job")
Result = TypeVar("Result")
# Runs on the compute thread: one result (or the SwarmError that job alone hit) per job.
BatchFn = Callable[[list[Job]], list[Result | SwarmError]]


class ComputeBatcher(Generic[Job, Result]):
    def __init__(
        self,
        compute: ComputeThread,
        run_batch: BatchFn[Job, Result],
        session_of: Callable[[Job], str],
        max_batch: int,
    ) -> None:
        self._compute = compute
        self._run_batch = run_batch
        self._session_of = session_of
        self._max_batch = max_batch
        self._waiting: list[tuple[Job, asyncio.Future[Result]]] = []
        self._runner: asyncio.Task[None] | None = None
        self.batches = 0  # batched calls run so far
        self.jobs = 0  # jobs they carried

    async def run(self, job: Job) -> Result:
        """Run one job with whatever else is waiting; raises the SwarmError that job alone
        hit, or what the compute thread raised for the whole batch."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting.append((job, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._drain(), name="compute-batcher")
        return await future

    async def _drain(self) -> None:
        while self._waiting:
            async with self._compute.turn(self._ready) as turn:
                batch = self._take()  # now, with every job that came while the thread was busy
                if not batch:
                    continue
                self.batches += 1
                self.jobs += len(batch)
                try:
                    results = await turn.run(self._run_batch, [job for job, _ in batch])
                except Exception as e:  # the compute thread failed: every job of it fails
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(e)
                    continue
                except BaseException:
                    for _, future in batch:
                        future.cancel()
                    raise
                # before the turn ends, so the jobs these results lead to are waiting when the
                # thread is given next
                for (_, future), result in zip(batch, results, strict=True):
                    if future.done():
                        continue
                    if isinstance(result, SwarmError):
                        future.set_exception(result)
                    else:
                        future.set_result(result)

    def _ready(self) -> int:
        """How many jobs a batch taken now would carry."""
        return min(self._max_batch, len({self._session_of(job) for job, _ in self._waiting}))

    def _take(self) -> list[tuple[Job, asyncio.Future[Result]]]:
        return self._take_fifo()

    def _take_fifo(self) -> list[tuple[Job, asyncio.Future[Result]]]:
        batch, self._waiting = one_per_session(
            self._waiting, lambda item: self._session_of(item[0]), self._max_batch
        )
        return batch


Item = TypeVar("Item")


def one_per_session(
    waiting: list[Item], session_of: Callable[[Item], str], max_batch: int
) -> tuple[list[Item], list[Item]]:
    """Up to max_batch of `waiting`, in order, at most one per session (a session's second
    job waits for the next batch, after the first has written its cache); and the rest."""
    if len(waiting) == 1 and max_batch >= 1:  # one stream's step, every token
        return [waiting[0]], []
    batch: list[Item] = []
    rest: list[Item] = []
    sessions: set[str] = set()
    for item in waiting:
        session = session_of(item)
        if len(batch) < max_batch and session not in sessions:
            batch.append(item)
            sessions.add(session)
        else:
            rest.append(item)
    return batch, rest


@dataclass(frozen=True)
class StepRun:
    """What running one step took: its output and the call it shared with other steps."""

    hidden: torch.Tensor
    started: float  # perf_counter
    finished: float
    first: bool = True  # the batch's first step: the one that reports its pace
    tokens: int = 0  # positions the whole call ran, of every step in it (0: this step's)
    # the call's time is a decode pace sample of `tokens` rows: it held one-position steps
    # only, or every row of its verify steps went through each layer with the others (rows
    # run one after the other cost that many calls, not that many rows)
    paced: bool = True


class DecodeBatcher(ComputeBatcher[StepMessage, StepRun]):
    """A hop's decode steps (hidden [1, 1, hidden]) and verify steps (hidden [1, rows,
    hidden], each row a decode position) of different sessions, one batched forward per span
    (`Shard.decode_rows`). `max_batch` counts steps, not rows: it bounds the streams that
    wait on one call, and a verify step's rows are bounded already (1 +
    `speculation.max_draft_tokens`); counted in rows, one long verify step would push other
    streams' decode steps into the next call, a whole call later, to save rows that cost
    less together than apart."""

    def __init__(self, compute: ComputeThread, serving: Serving, max_batch: int) -> None:
        def forward(messages: list[StepMessage]) -> list[StepRun | SwarmError]:
            return decode_steps(serving, messages)

        super().__init__(compute, forward, _session_of_step, max_batch)


def _session_of_step(message: StepMessage) -> str:
    return message.session


class PrefillBatcher(ComputeBatcher[StepMessage, StepRun]):
    """A hop's prefill chunks (hidden [1, seq, hidden]) of different sessions, one call per
    span (`Shard.prefill_batch`), taken in the order `prefill_order.next_batch` gives: the
    session least far along first, at most `max_tokens` tokens and `max_batch` sessions."""

    def __init__(
        self, compute: ComputeThread, serving: Serving, max_batch: int, max_tokens: int
    ) -> None:
        def forward(messages: list[StepMessage]) -> list[StepRun | SwarmError]:
            return _prefill_batch(serving, messages)

        super().__init__(compute, forward, _session_of_step, max_batch)
        self._max_tokens = max_tokens

    def _take(self) -> list[tuple[StepMessage, asyncio.Future[StepRun]]]:
        waiting = [  # the waiting list is in arrival order
            WaitingChunk(m.session, m.position, m.hidden.shape[1], arrived)
            for arrived, (m, _) in enumerate(self._waiting)
        ]
        chosen = next_batch(waiting, self._max_batch, self._max_tokens)
        taken = set(chosen)
        batch = [self._waiting[i] for i in chosen]
        self._waiting = [item for i, item in enumerate(self._waiting) if i not in taken]
        return batch


# one of Shard's batched calls: decode_rows, or prefill_batch as one
ShardBatch = Callable[[Shard, list[tuple[SessionId, torch.Tensor, int]], LayerSpan], DecodeRun]


def decode_steps(serving: Serving, messages: list[StepMessage]) -> list[StepRun | SwarmError]:
    """Runs on the compute thread: one batched forward per shard and layers, decode and
    verify steps together."""
    return _batched(serving, messages, Shard.decode_rows)


def _prefill_call(
    shard: Shard, steps: list[tuple[SessionId, torch.Tensor, int]], layers: LayerSpan
) -> DecodeRun:
    return DecodeRun(shard.prefill_batch(steps, layers), shared=True)


def _prefill_batch(serving: Serving, messages: list[StepMessage]) -> list[StepRun | SwarmError]:
    """Runs on the compute thread: one call per shard and layers, each chunk its own rows."""
    return _batched(serving, messages, _prefill_call)


def _batched(
    serving: Serving, messages: list[StepMessage], call: ShardBatch
) -> list[StepRun | SwarmError]:
    """Groups the steps by shard and layers and runs `call` once per group."""
    started = time.perf_counter()
    outputs: list[torch.Tensor | SwarmError] = [SpanError("not run")] * len(messages)
    shared = True
    for (shard, layers), indices in _groups(serving, messages, outputs).items():
        steps = [
            (SessionId(messages[i].session), messages[i].hidden, messages[i].position)
            for i in indices
        ]
        run = call(shard, steps, layers)
        shard.synchronize()  # the step's time below is what it took, a GPU's part included
        shared = shared and run.shared
        for i, output in zip(indices, run.outputs, strict=True):
            outputs[i] = output
    return _runs(outputs, started, shared)


def _groups(
    serving: Serving, messages: list[StepMessage], outputs: list[torch.Tensor | SwarmError]
) -> dict[tuple[Shard, LayerSpan], list[int]]:
    """The messages' indices by the shard and layers they run; a message no shard serves
    gets its error in `outputs`."""
    groups: dict[tuple[Shard, LayerSpan], list[int]] = {}
    for i, message in enumerate(messages):
        layers = message.route[0].span
        shard = serving.shard_for(SessionId(message.session), layers)
        if shard is None:
            outputs[i] = SpanError(f"this node does not serve layers {layers} now")
            continue
        if message.prefix:
            try:
                start_from_kept_blocks(shard, message)
            except SwarmError as e:
                outputs[i] = e
                continue
        groups.setdefault((shard, layers), []).append(i)
    return groups


def start_from_kept_blocks(shard: Shard, message: StepMessage) -> None:
    """The session of a first step that names kept prompt blocks starts from them, in the
    same compute job as the step: a later chunk of the session, which names none, never
    runs between the two."""
    shard.adopt_prefix(SessionId(message.session), message.prefix, message.route[0].span)


def _runs(
    outputs: list[torch.Tensor | SwarmError], started: float, shared: bool
) -> list[StepRun | SwarmError]:
    finished = time.perf_counter()
    ran = [out for out in outputs if isinstance(out, torch.Tensor)]
    tokens = sum(out.shape[1] for out in ran)
    paced = shared or all(out.shape[1] == 1 for out in ran)
    first = next((i for i, out in enumerate(outputs) if isinstance(out, torch.Tensor)), -1)
    return [
        out
        if isinstance(out, SwarmError)
        else StepRun(out, started, finished, i == first, tokens, paced)
        for i, out in enumerate(outputs)
    ]
