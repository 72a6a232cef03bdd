"""Continuous batching at a hop: decode steps that arrive while the compute thread is busy
wait together and then run as one batched forward per span, so each weight is read once for
all of them. A lone step runs at once; nothing waits for a batch to fill."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import torch

from swarm.errors import SpanError, SwarmError
from swarm.runtime.compute import ComputeThread
from swarm.runtime.serving import Serving
from swarm.runtime.shard import DecodeStep, Shard
from swarm.types import LayerSpan, SessionId
from swarm.wire import StepMessage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepRun:
    """What running one step took: its output and the compute it shared with `batch` steps."""

    hidden: torch.Tensor
    started: float  # perf_counter
    finished: float
    batch: int


class DecodeBatcher:
    def __init__(
        self,
        compute: ComputeThread,
        serving: Serving,
        max_batch: int,
    ) -> None:
        self._compute = compute
        self._serving = serving
        self._max_batch = max_batch
        self._waiting: list[tuple[StepMessage, asyncio.Future[StepRun]]] = []
        self._runner: asyncio.Task[None] | None = None

    async def run(self, message: StepMessage) -> StepRun:
        """Run one decode step (hidden [1, 1, hidden]) with whatever else is waiting; raises
        the SwarmError that step alone hit."""
        future: asyncio.Future[StepRun] = asyncio.get_running_loop().create_future()
        self._waiting.append((message, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._drain(), name="decode-batcher")
        return await future

    async def _drain(self) -> None:
        while self._waiting:
            batch = self._take()
            messages = [m for m, _ in batch]
            try:
                results = await self._compute.run(_forward_batch, self._serving, messages)
            except Exception as e:  # the compute thread failed: every step of it fails
                for _, future in batch:
                    if not future.done():
                        future.set_exception(e)
                continue
            except BaseException:
                for _, future in batch:
                    future.cancel()
                raise
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, SwarmError):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    def _take(self) -> list[tuple[StepMessage, asyncio.Future[StepRun]]]:
        """Up to max_batch waiting steps, at most one per session (a second step of a session
        waits for the next batch, after the first has written its cache)."""
        Waiting = list[tuple[StepMessage, asyncio.Future[StepRun]]]
        batch: Waiting = []
        rest: Waiting = []
        sessions: set[str] = set()
        for item in self._waiting:
            session = item[0].session
            if len(batch) < self._max_batch and session not in sessions:
                batch.append(item)
                sessions.add(session)
            else:
                rest.append(item)
        self._waiting = rest
        return batch


def _forward_batch(serving: Serving, messages: list[StepMessage]) -> list[StepRun | SwarmError]:
    """Runs on the compute thread: groups the steps by shard and layers, one batched forward
    per group."""
    started = time.perf_counter()
    groups: dict[tuple[int, LayerSpan], tuple[Shard, list[int]]] = {}
    outputs: list[torch.Tensor | SwarmError] = [SpanError("not run")] * len(messages)
    for i, message in enumerate(messages):
        layers = message.route[0].span
        shard = serving.shard_for(SessionId(message.session), layers)
        if shard is None:
            outputs[i] = SpanError(f"this node does not serve layers {layers} now")
            continue
        groups.setdefault((id(shard), layers), (shard, []))[1].append(i)
    for (_, layers), (shard, indices) in groups.items():
        steps: list[DecodeStep] = [
            (SessionId(messages[i].session), messages[i].hidden, messages[i].position)
            for i in indices
        ]
        for i, output in zip(indices, shard.decode_batch(steps, layers), strict=True):
            outputs[i] = output
    finished = time.perf_counter()
    return [
        out if isinstance(out, SwarmError) else StepRun(out, started, finished, len(messages))
        for out in outputs
    ]
