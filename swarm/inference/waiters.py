"""Steps the entry has sent and waits for: the hop side's dispatch resolves them with the
results and error frames that arrive, the entry side's pipeline awaits them."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from swarm.types import SessionId
from swarm.wire import ErrorMessage, ResultMessage

Reply = ResultMessage | ErrorMessage


@dataclass
class StepWaiters:
    """Steps in flight, keyed by (session, step); results and error frames resolve them.

    The compute thread may claim a step whose result reached it (it runs the entry's head on
    that result before the event loop sees it): from then on the step is as good as answered,
    so its waiter neither gives up nor re-routes, and the head's draw from the request's
    sampler is never thrown away. Claims and forgetting take one lock."""

    _waiting: dict[tuple[str, int], asyncio.Future[Reply]] = field(default_factory=dict)
    # perf_counter when each resolved reply's frame was decoded, until its step is forgotten
    _decoded_at: dict[tuple[str, int], float] = field(default_factory=dict)
    _claimed: set[tuple[str, int]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def expect(self, session: SessionId, step: int) -> asyncio.Future[Reply]:
        return self.expect_on(asyncio.get_running_loop(), session, step)

    def expect_on(
        self, loop: asyncio.AbstractEventLoop, session: SessionId, step: int
    ) -> asyncio.Future[Reply]:
        """`expect` from any thread (the compute thread's steps sent ahead, ahead.py): the
        future belongs to `loop`, which alone resolves and awaits it."""
        future: asyncio.Future[Reply] = loop.create_future()
        with self._lock:
            self._waiting[(session, step)] = future
        return future

    def claim(self, session: str, step: int) -> bool:
        """From the compute thread, holding a result: whether the step is still awaited (now
        claimed, so its waiter waits for it whatever its deadline)."""
        key = (session, step)
        with self._lock:
            if key not in self._waiting:
                return False
            self._claimed.add(key)
            return True

    def claimed(self, session: SessionId, step: int) -> bool:
        return (session, step) in self._claimed

    def resolve(self, reply: Reply, decoded_at: float) -> bool:
        """False when nobody waits for it (late, duplicate, or forged by a confused peer).
        `decoded_at`: perf_counter when its frame was decoded."""
        key = (reply.session, reply.step)
        with self._lock:
            future = self._waiting.pop(key, None)
        if future is None or future.done():
            return False
        self._decoded_at[key] = decoded_at
        future.set_result(reply)
        return True

    def decoded_at(self, session: SessionId, step: int) -> float | None:
        """When the reply to a resolved step was decoded."""
        return self._decoded_at.get((session, step))

    def forget(self, session: SessionId, step: int) -> None:
        with self._lock:
            self._waiting.pop((session, step), None)
            self._claimed.discard((session, step))
        self._decoded_at.pop((session, step), None)
