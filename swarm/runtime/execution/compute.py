"""The compute thread: torch work runs here, never on the event loop, so a long prefill does
not stall gossip or the HTTP server. One thread per device; callers beyond `queue_size`
wait their turn (backpressure) instead of piling up.

Keep all torch work of a process on this one thread, loading included. Torch ops on a second
thread create a second OpenMP team, and libgomp then throttles spin-waiting for both teams
(more threads than cores): measured here, decode of the default model went from ~39 to ~56
ms per token.

Jobs are handed to the thread one at a time, each once the one before it has finished, not
queued inside the thread: a batcher then forms its batch when the thread is free for it, so
every step that arrived meanwhile joins (see `turn`). Between jobs the thread also reads the
sockets registered with `watch` (`worker.py`): a hop's decode steps arrive and run there
without the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar

import torch

from swarm.errors import ComputeError
from swarm.runtime.execution.turns import Turns
from swarm.runtime.execution.worker import Reader, Worker

P = ParamSpec("P")
T = TypeVar("T")
log = logging.getLogger(__name__)


class ComputeThread:
    def __init__(self, threads: int = 0, queue_size: int = 64, name: str = "swarm-compute") -> None:
        self._worker = Worker(name, functools.partial(_set_threads, threads))
        self._pending = _Pending()
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
                    yield Turn(self._worker, self._pending)
                finally:
                    self._turns.release()
        finally:
            self._in_flight -= 1

    def watch(self, fileobj: Any, reader: Reader) -> None:
        """Call `reader` on the compute thread whenever `fileobj` is readable, between jobs,
        until it returns False."""
        self._worker.watch(fileobj, reader)

    def post(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the compute thread after the jobs queued now, as a reader runs: outside
        any turn, with no result (it reports its own outcome; what it raises is logged).
        Callable from any thread."""
        self._worker.submit(_logged(fn))

    def after_reads(self, hook: Callable[[], None]) -> None:
        """Run `hook` on the compute thread after each round of `watch` readers."""
        self._worker.after_reads(hook)

    def on_thread(self) -> bool:
        """Whether the caller runs on the compute thread."""
        return threading.get_ident() == self._worker.ident

    def close(self) -> None:
        """Finish the running job, refuse the queued ones, stop the thread."""
        self._closed = True
        self._worker.stop()
        self._pending.refuse_all()


class Turn:
    """The compute thread while a caller holds its turn."""

    def __init__(self, worker: Worker, pending: _Pending) -> None:
        self._worker = worker
        self._pending = pending

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        call = functools.partial(fn, *args, **kwargs)

        def job() -> None:
            if not self._pending.start(future):
                return  # refused at close
            try:
                result = call()
            except BaseException as e:  # the caller gets it, the thread goes on
                _settle(loop, future, None, e)
            else:
                _settle(loop, future, result, None)

        self._pending.add(future, loop)
        self._worker.submit(job)
        return await future


class _Pending:
    """Jobs handed to the thread that have not started: refused when it closes, so that no
    caller waits for a job that will never run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[asyncio.Future[Any], asyncio.AbstractEventLoop] = {}

    def add(self, future: asyncio.Future[Any], loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self._waiting[future] = loop

    def start(self, future: asyncio.Future[Any]) -> bool:
        with self._lock:
            return self._waiting.pop(future, None) is not None

    def refuse_all(self) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for future, loop in waiting.items():
            _settle(loop, future, None, ComputeError("the compute thread is closed"))


def _logged(fn: Callable[[], None]) -> Callable[[], None]:
    def job() -> None:
        try:
            fn()
        except Exception:
            log.exception("a job posted to the compute thread failed")

    return job


def _settle(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: object,
    error: BaseException | None,
) -> None:
    def settle() -> None:
        if future.done():  # the caller was cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
        loop.call_soon_threadsafe(settle)


def _set_threads(threads: int) -> None:
    if threads:
        torch.set_num_threads(threads)
