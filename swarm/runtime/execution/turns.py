"""Who gets the compute thread next. One caller holds it at a time; when it lets go and others
wait, the thread goes to the one with the most jobs ready, after the event loop has run what
the finished job woke (its results travel a few callbacks before they become new jobs).

First come, first served split sessions for good: 8 streams on one node ran as a batch of 7
and a batch of 1 taking turns with each other's heads, because the lone session's step was
always waiting when the seven's batch ended and the seven's next steps came back a few loop
turns later. Choosing the biggest waiting batch lets the seven's heads go first and the lone
step join their next batch. A caller passed over `_MAX_PASSES` times goes next whatever its
size, so a prefill is not starved by a stream of batches."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

# loop iterations between a release and the choice: a result's way to a job (also how long the
# entry's own decode steps wait for the other sessions' before they go to the thread)
SETTLE_ROUNDS = 4
_MAX_PASSES = 2


@dataclass(eq=False)  # each waiter is itself: list removal goes by identity
class _Waiter:
    granted: asyncio.Future[None]
    jobs: Callable[[], int]  # how many jobs it would run if given the thread now
    passes: int = 0


class Turns:
    def __init__(self) -> None:
        self._held = False
        self._waiting: list[_Waiter] = []

    async def acquire(self, jobs: Callable[[], int]) -> None:
        if not self._held and not self._waiting:
            self._held = True
            return
        waiter = _Waiter(asyncio.get_running_loop().create_future(), jobs)
        self._waiting.append(waiter)
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
            elif not waiter.granted.cancelled():  # granted as it was cancelled: pass it on
                self.release()
            raise

    def release(self) -> None:
        if not self._waiting:
            self._held = False
            return
        self._settle(SETTLE_ROUNDS)  # the thread stays held until it is given

    def _settle(self, rounds: int) -> None:
        if rounds:
            asyncio.get_running_loop().call_soon(self._settle, rounds - 1)
        else:
            self._give()

    def _give(self) -> None:
        # a waiter cancelled since the release leaves the list only when its task runs next
        self._waiting = [w for w in self._waiting if not w.granted.done()]
        if not self._waiting:
            self._held = False
            return
        starved = [w for w in self._waiting if w.passes >= _MAX_PASSES]
        # the oldest starved waiter, else the biggest (the oldest among equals: max keeps the first)
        chosen = starved[0] if starved else max(self._waiting, key=lambda w: w.jobs())
        self._waiting.remove(chosen)
        for waiter in self._waiting:
            waiter.passes += 1
        chosen.granted.set_result(None)
