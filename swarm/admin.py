"""The admin endpoint: change how this node behaves while it runs. Today one setting, the
slowdown that simulates background load (issue: re-split live when a machine slows down).
Requests are frames sealed with the swarm key, so only holders of the swarm secret (or, on a
loopback-only swarm, processes on this machine) can send them, and a replayed one is refused."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from aiohttp import web

from swarm.errors import FrameError
from swarm.membership.gossip import Gossiper
from swarm.wire import FrameCodec, SetSlowdown

log = logging.getLogger(__name__)

SLOWDOWN_PATH = "/admin/slowdown"
_MAX_ADMIN_BYTES = 4096


@dataclass
class Pace:
    """Settings that change while the node runs; the hop reads them on every step."""

    slowdown: float  # >= 1


class Admin:
    def __init__(self, codec: FrameCodec, pace: Pace, gossiper: Gossiper) -> None:
        self._codec = codec
        self._pace = pace
        self._gossiper = gossiper

    async def handle(self, request: web.Request) -> web.Response:
        """POST /admin/slowdown with a sealed SetSlowdown frame: 200 {"slowdown": x}; 400 for
        anything else (unauthenticated, replayed, malformed), which changes nothing."""
        body = await request.content.read(_MAX_ADMIN_BYTES + 1)
        try:
            if len(body) > _MAX_ADMIN_BYTES:
                raise FrameError(f"an admin request is at most {_MAX_ADMIN_BYTES} bytes")
            message = self._codec.decode(body).message
            if not isinstance(message, SetSlowdown):
                raise FrameError(f"expected a set-slowdown frame, not {type(message).__name__}")
        except FrameError as e:
            log.warning("refused an admin request from %s: %s", request.remote, e)
            return web.json_response({"error": str(e)}, status=400)
        self.set_slowdown(message.slowdown)
        return web.json_response({"slowdown": message.slowdown})

    def set_slowdown(self, slowdown: float) -> None:
        log.info("slowdown %.2f -> %.2f", self._pace.slowdown, slowdown)
        self._pace.slowdown = slowdown
        local = self._gossiper.local
        self._gossiper.update_record(dataclasses.replace(local, slowdown=slowdown))
