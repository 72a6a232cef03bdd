"""Finding the culprit of a late step: ask every hop of its route whether it is there. A hop's
event loop answers a probe at once, whatever its compute thread is doing, so a hop that stays
silent is frozen (SIGSTOP, a hung machine) or gone, while a hop that answers is only busy."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence

from swarm.errors import LinkError
from swarm.net.links import Links
from swarm.types import NodeId
from swarm.wire import Hop, Peer, Probe, ProbeReply

log = logging.getLogger(__name__)


class Prober:
    def __init__(self, me: Peer, links: Links) -> None:
        self._me = me
        self._links = links
        self._nonces = itertools.count(1)
        self._waiting: dict[int, tuple[NodeId, asyncio.Future[None]]] = {}

    async def silent(self, hops: Sequence[Hop], timeout_s: float) -> list[NodeId]:
        """The hops that do not answer within `timeout_s`, in route order."""
        answers = await asyncio.gather(*(self._ask(hop, timeout_s) for hop in hops))
        return [hop.node_id for hop, answered in zip(hops, answers, strict=True) if not answered]

    async def _ask(self, hop: Hop, timeout_s: float) -> bool:
        nonce = next(self._nonces)
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[nonce] = (hop.node_id, answered)
        try:
            async with asyncio.timeout(timeout_s):
                await self._links.send(hop.address, Probe(nonce, self._me))
                await answered
            return True
        except (LinkError, TimeoutError) as e:
            log.info("hop %s did not answer a probe: %s", hop.node_id, e or "timeout")
            return False
        finally:
            self._waiting.pop(nonce, None)

    def resolve(self, reply: ProbeReply) -> None:
        waiting = self._waiting.get(reply.nonce)
        if waiting is None or waiting[0] != reply.node_id or waiting[1].done():
            return  # late, or from someone we did not ask
        waiting[1].set_result(None)
