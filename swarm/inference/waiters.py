"""Steps the entry has sent and waits for: the hop side's dispatch resolves them with the
results and error frames that arrive, the entry side's pipeline awaits them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from swarm.types import SessionId
from swarm.wire import ErrorMessage, ResultMessage

Reply = ResultMessage | ErrorMessage


@dataclass
class StepWaiters:
    """Steps in flight, keyed by (session, step); results and error frames resolve them."""

    _waiting: dict[tuple[str, int], asyncio.Future[Reply]] = field(default_factory=dict)
    # perf_counter when each resolved reply's frame was decoded, until its step is forgotten
    _decoded_at: dict[tuple[str, int], float] = field(default_factory=dict)

    def expect(self, session: SessionId, step: int) -> asyncio.Future[Reply]:
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiting[(session, step)] = future
        return future

    def resolve(self, reply: Reply, decoded_at: float) -> bool:
        """False when nobody waits for it (late, duplicate, or forged by a confused peer).
        `decoded_at`: perf_counter when its frame was decoded."""
        key = (reply.session, reply.step)
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
        self._waiting.pop((session, step), None)
        self._decoded_at.pop((session, step), None)
