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

    def expect(self, session: SessionId, step: int) -> asyncio.Future[Reply]:
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiting[(session, step)] = future
        return future

    def resolve(self, reply: Reply) -> bool:
        """False when nobody waits for it (late, duplicate, or forged by a confused peer)."""
        future = self._waiting.pop((reply.session, reply.step), None)
        if future is None or future.done():
            return False
        future.set_result(reply)
        return True

    def forget(self, session: SessionId, step: int) -> None:
        self._waiting.pop((session, step), None)
