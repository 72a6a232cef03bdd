"""The compute thread: torch work runs here, never on the event loop, so a long prefill does
not stall gossip or the HTTP server. One thread per device; callers beyond `queue_size`
wait their turn (backpressure) instead of piling up.

Keep all torch work of a process on this one thread, loading included. Torch ops on a second
thread create a second OpenMP team, and libgomp then throttles spin-waiting for both teams
(more threads than cores): measured here, decode of the default model went from ~39 to ~56
ms per token.

Jobs are handed to the thread one at a time, each once the one before it has finished, not
queued inside the executor: a batcher then forms its batch when the thread is free for it, so
every step that arrived meanwhile joins (see `turn`)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import ParamSpec, TypeVar

import torch

from swarm.errors import ComputeError
from swarm.runtime.execution.turns import Turns

P = ParamSpec("P")
T = TypeVar("T")


class ComputeThread:
    def __init__(self, threads: int = 0, queue_size: int = 64, name: str = "swarm-compute") -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=name, initializer=_set_threads, initargs=(threads,)
        )
        self._slots = asyncio.Semaphore(queue_size)
        self._turns = Turns()
        self._closed = False
        self._in_flight = 0  # jobs submitted and not finished, the running one included

    @property
    def queue_depth(self) -> int:
        """Jobs waiting behind the one running now."""
        return max(0, self._in_flight - 1)

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        async with self.turn() as turn:
            return await turn.run(fn, *args, **kwargs)

    @asynccontextmanager
    async def turn(self, jobs: Callable[[], int] = lambda: 1) -> AsyncIterator[Turn]:
        """The thread, given to one caller at a time (`Turns` chooses whom, `jobs` says how
        many jobs this caller would run now); what runs inside starts at once. A batcher takes
        its batch inside the turn, so the steps that arrived while other jobs ran (a head, a
        prefill, another batch) join it."""
        if self._closed:
            raise ComputeError("the compute thread is closed")
        self._in_flight += 1
        try:
            async with self._slots:
                await self._turns.acquire(jobs)
                try:
                    if self._closed:  # closed while this caller waited its turn
                        raise ComputeError("the compute thread is closed")
                    yield Turn(self._executor)
                finally:
                    self._turns.release()
        finally:
            self._in_flight -= 1

    def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)


class Turn:
    """The compute thread while a caller holds its turn."""

    def __init__(self, executor: ThreadPoolExecutor) -> None:
        self._executor = executor

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))


def _set_threads(threads: int) -> None:
    if threads:
        torch.set_num_threads(threads)
