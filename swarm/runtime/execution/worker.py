"""The compute thread itself: one OS thread that runs jobs handed to it and, between jobs,
reads the sockets registered with it.

Why its own loop rather than an executor: a decode step's frame that the event loop reads, hands
to the compute thread and takes back to send costs three wake-ups per hop (the loop, the
thread, the loop again), measured at ~1 ms of a hop's ~2.8 ms on a 2-core VM, against ~0.1 ms
for the one wake-up of a thread blocked on the socket itself. A thread that waits in
`select` on its sockets and on a wake-up pipe for jobs takes a step's frame straight from the
socket, and the one that computes it writes the next frame (`swarm.net.fast_links`).

Everything registered runs on this thread: a reader's callback, the hook run after each round
of reads, and jobs, one at a time, in the order they came. Nothing here knows what a frame is."""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Reader = Callable[[], bool]  # reads what its socket has; False: unregister it (closed, bad)


class Worker:
    def __init__(self, name: str, initializer: Callable[[], None] | None = None) -> None:
        self._jobs: deque[Callable[[], None]] = deque()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._after_reads: Callable[[], None] | None = None
        self._stopping = False
        self._initializer = initializer
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` on the thread after the jobs before it (callable from any thread)."""
        self._jobs.append(job)
        if threading.get_ident() != self._thread.ident:
            # the thread itself looks at its jobs before it waits again: no wake-up byte to
            # write and read back (two system calls on the way to an entry's own next step)
            self._wake()

    def watch(self, fileobj: Any, reader: Reader) -> None:
        """Call `reader` on the thread whenever `fileobj` is readable, until it returns False
        (then `fileobj` is unregistered; closing it is the reader's business)."""

        def register() -> None:
            self._selector.register(fileobj, selectors.EVENT_READ, reader)

        self.submit(register)

    def after_reads(self, hook: Callable[[], None]) -> None:
        """Run `hook` on the thread after each round of readers, before the next job: what
        the readers gathered runs as one batch. Set it before the first `watch`."""
        self._after_reads = hook

    def stop(self, wait: bool = True) -> None:
        """Finish the running job, drop the queued ones, stop."""
        self._stopping = True
        self._jobs.clear()
        self._wake()
        if wait and threading.get_ident() != self._thread.ident:
            self._thread.join()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full: a wake-up is pending anyway
            os.write(self._wake_w, b"\0")

    def _serve(self) -> None:
        if self._initializer is not None:
            self._initializer()
        try:
            while not self._stopping:
                self._round()
        finally:
            for key in list(self._selector.get_map().values()):
                with contextlib.suppress(Exception):
                    self._selector.unregister(key.fileobj)
            self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _round(self) -> None:
        # block only when no job waits: a job queued while readers run is taken this round
        ready = self._selector.select(timeout=0 if self._jobs else None)
        read_any = False
        for key, _ in ready:
            if key.data is None:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
                continue
            read_any = True
            keep = False
            try:
                keep = key.data()
            except Exception:  # a reader's failure ends that reader only
                log.exception("a socket reader on the compute thread failed")
            if not keep:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(key.fileobj)
        if read_any and self._after_reads is not None:
            try:
                self._after_reads()
            except Exception:
                log.exception("the compute thread's batch after reads failed")
        if self._jobs and not self._stopping:
            self._jobs.popleft()()  # jobs report their own outcome (compute.py wraps them)
