"""What stands in front of the hop server while the node leaves: steps it will not serve are
answered at once with an error frame, so their entries re-route without waiting for a
deadline or a probe."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from swarm.errors import LinkError
from swarm.inference.hop import HopServer
from swarm.net.links import Links
from swarm.wire import CloseSession, ErrorCode, ErrorMessage, StepMessage

log = logging.getLogger(__name__)


@dataclass
class LeavingGate:
    hop: HopServer
    links: Links
    covered: Callable[[], bool]  # whether members that stay serve every layer of this node
    draining: bool = False  # leaving: sessions that start now go elsewhere once covered
    gone: bool = False  # drained: no step is served any more

    async def step(self, message: StepMessage, wire_ms: float, decoded_at: float) -> None:
        starts = message.position == 0  # a new session, or a replay on a new route
        if self.gone or (self.draining and starts and self.covered()):
            await self._refuse(message)
        else:
            await self.hop.step(message, wire_ms, decoded_at)

    async def close(self, message: CloseSession) -> None:
        await self.hop.close(message)

    async def _refuse(self, message: StepMessage) -> None:
        """LEAVING: the entry re-routes at once, does not ban this node (it is healthy) and
        leaves it out of the session's routes from then on: an entry whose view has not yet
        seen the nodes that take its layers over waits for them rather than asking again."""
        me = self.hop.core.node_id
        reason = f"node {me} is leaving"
        error = ErrorMessage(message.session, message.step, ErrorCode.LEAVING, reason, me)
        try:
            await self.links.send(message.entry.address, error)
        except LinkError as e:
            log.info("cannot tell entry %s that this node leaves: %s", message.entry.address, e)
