"""Inbound links: the aiohttp handler that accepts a peer's websocket, authenticates and
decodes each frame, and queues it for the node. A bad frame closes that link only."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from swarm.config import NetConfig
from swarm.errors import FrameError
from swarm.logs import Throttle
from swarm.types import NodeId
from swarm.wire import FrameCodec, Message, Received

log = logging.getLogger(__name__)

_POLICY_VIOLATION = 1008  # websocket close code
_LOG_INTERVAL_S = 60.0  # at most one line per refused peer address per this many seconds


class Inbox:
    """Frames received from peers, in arrival order; a full inbox stops reading from sockets."""

    def __init__(self, codec: FrameCodec, config: NetConfig) -> None:
        self._codec = codec
        self._config = config
        # each frame with the milliseconds its authentication and decoding took
        self.queue: asyncio.Queue[tuple[Received, float]] = asyncio.Queue(maxsize=config.inbox_size)
        self.rejected_frames = 0
        self._throttle = Throttle(_LOG_INTERVAL_S)

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(
            heartbeat=self._config.heartbeat_s,
            max_msg_size=self._codec.limits.max_frame_bytes,
            compress=False,
        )
        await socket.prepare(request)
        peer = request.remote or "?"
        async for message in socket:
            if message.type is not aiohttp.WSMsgType.BINARY:
                await self._reject(socket, peer, "text messages are not frames")
                break
            started = time.perf_counter()
            try:
                received = self._codec.decode(message.data)
            except FrameError as e:
                await self._reject(socket, peer, str(e))
                break
            await self.queue.put((received, (time.perf_counter() - started) * 1000))
        return socket

    def own_delivery(self, me: NodeId) -> Callable[[Message], Awaitable[None]]:
        """What this node's links call with a message to itself: it queues as if received
        (counter 0: the replay window guards sockets only), with no decoding time."""

        async def deliver(message: Message) -> None:
            await self.queue.put((Received(me, 0, message), 0.0))

        return deliver

    async def _reject(self, socket: web.WebSocketResponse, peer: str, reason: str) -> None:
        self.rejected_frames += 1
        held = self._throttle.allow(peer)
        if held is not None:
            more = f" ({held} more refusals since the last line)" if held else ""
            log.warning("refused a link from %s: %s%s", peer, reason, more)
        await socket.close(code=_POLICY_VIOLATION, message=reason[:120].encode())
