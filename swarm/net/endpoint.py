"""Inbound links: the aiohttp handler that accepts a peer's websocket, authenticates and
decodes each frame, and queues it for the node. A bad frame closes that link only."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from swarm.config import NetConfig
from swarm.errors import FrameError
from swarm.logs import Refusals
from swarm.types import NodeId
from swarm.wire import FrameCodec, LinkHello, Message, Received

log = logging.getLogger(__name__)

_POLICY_VIOLATION = 1008  # websocket close code


class Inbox:
    """Frames received from peers, in arrival order; a full inbox stops reading from sockets.

    A new link is a stranger's until its first frame authenticates: it must arrive within
    `net.link_auth_timeout_s`, and only a few such links are read at once, since each may
    carry a frame of up to the wire's frame limit before its tag is checked."""

    def __init__(self, codec: FrameCodec, config: NetConfig) -> None:
        self._codec = codec
        self._config = config
        # each frame with the milliseconds its authentication and decoding took
        self.queue: asyncio.Queue[tuple[Received, float]] = asyncio.Queue(maxsize=config.inbox_size)
        self.refusals = Refusals(log, "a link")
        self._open: weakref.WeakSet[web.WebSocketResponse] = weakref.WeakSet()  # peers' links
        self._strangers = 0  # links whose first frame has not authenticated yet
        self._max_strangers = max(1, config.max_unauthenticated // 4)

    @property
    def rejected_frames(self) -> int:
        return self.refusals.total

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(
            heartbeat=self._config.heartbeat_s,
            max_msg_size=self._codec.limits.max_frame_bytes,
            compress=False,
        )
        self._open.add(socket)
        peer = request.remote or "?"
        if self._strangers >= self._max_strangers:
            await socket.prepare(request)
            await self._reject(socket, peer, "busy", "too many links authenticating at once")
            return socket
        await socket.prepare(request)
        await socket.send_str(self._codec.sender)  # the id the peer addresses its frames to
        self._strangers += 1
        try:
            first = await self._first(socket, peer)
        finally:
            self._strangers -= 1
        if first is None:
            return socket
        if not isinstance(first[0].message, LinkHello):
            await self.queue.put(first)
        async for message in socket:
            received = await self._decode(socket, peer, message)
            if received is None:
                break
            if not isinstance(received[0].message, LinkHello):
                await self.queue.put(received)
        return socket

    def own_delivery(self, me: NodeId) -> Callable[[Message], Awaitable[None]]:
        """What this node's links call with a message to itself: it queues as if received
        (counter 0: the replay window guards sockets only), with no decoding time."""

        async def deliver(message: Message) -> None:
            await self.queue.put((Received(me, 0, message), 0.0))

        return deliver

    async def close_all(self) -> None:
        """Close every link peers hold open to this node (it leaves): the entries watching
        them re-route at once. A peer that sends again opens a new one."""
        await asyncio.gather(
            *(s.close(code=aiohttp.WSCloseCode.GOING_AWAY) for s in list(self._open))
        )

    async def _first(
        self, socket: web.WebSocketResponse, peer: str
    ) -> tuple[Received, float] | None:
        """The link's first frame, authenticated, or None once the link is closed."""
        try:
            message = await socket.receive(timeout=self._config.link_auth_timeout_s)
        except TimeoutError:
            await self._reject(socket, peer, "auth_timeout", "no frame in time")
            return None
        if message.type is aiohttp.WSMsgType.ERROR:  # e.g. a message over the frame limit
            await self._reject(socket, peer, "bad_message", str(socket.exception()))
            return None
        return await self._decode(socket, peer, message)

    async def _decode(
        self, socket: web.WebSocketResponse, peer: str, message: aiohttp.WSMessage
    ) -> tuple[Received, float] | None:
        if message.type is not aiohttp.WSMsgType.BINARY:
            # a close or a missed heartbeat ends the link without a refusal; text is one
            if message.type is aiohttp.WSMsgType.TEXT:
                await self._reject(socket, peer, "bad_message", "text messages are not frames")
            return None
        started = time.perf_counter()
        try:
            received = self._codec.decode(message.data)
        except FrameError as e:
            await self._reject(socket, peer, "bad_frame", str(e))
            return None
        return received, (time.perf_counter() - started) * 1000

    async def _reject(
        self, socket: web.WebSocketResponse, peer: str, reason: str, detail: str
    ) -> None:
        self.refusals.refuse(reason, peer, detail)
        await socket.close(code=_POLICY_VIOLATION, message=detail[:120].encode())
