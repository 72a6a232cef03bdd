"""Inbound links: the aiohttp handler that accepts a peer's websocket once its hello
authenticates, then authenticates and decodes each frame and queues it for the node. A bad
frame closes that link only."""

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
from swarm.net.fast_links import FAST_PORT_HEADER
from swarm.net.hello import HELLO_HEADER, READY, open_hello
from swarm.types import NodeId
from swarm.wire import FrameCodec, LinkHello, Message, Received

log = logging.getLogger(__name__)

_POLICY_VIOLATION = 1008  # websocket close code
_REFUSED_MESSAGE_BYTES = 4096  # bytes of a message read from a link whose hello failed
_REFUSED_CLOSE_S = 1.0  # seconds such a link has to answer the close before it is cut


class Inbox:
    """Frames received from peers, in arrival order; a full inbox stops reading from sockets.

    A link takes frames only once its upgrade request carried an authenticated hello
    (swarm/net/hello.py); a stranger's is closed at once. Its messages are then capped at the
    codec's frame limit, which the node sizes to the largest activation frame its model
    produces (swarm.wire.activation_limits)."""

    def __init__(
        self,
        codec: FrameCodec,
        config: NetConfig,
        loop: asyncio.AbstractEventLoop | None = None,
        fast_port: int = 0,
    ) -> None:
        """`loop`: the event loop that reads this inbox, for frames other threads offer
        (None: it takes none); `fast_port`: where this node takes fast links
        (fast_links.py), which a peer asking for its id learns (0: it does not)."""
        self._codec = codec
        self._config = config
        # each frame with the milliseconds its authentication and decoding took
        # (the frame, milliseconds decoding it, perf_counter when decoded)
        self.queue: asyncio.Queue[tuple[Received, float, float]] = asyncio.Queue(
            maxsize=config.inbox_size
        )
        self.refusals = Refusals(log, "a link")
        self._open: weakref.WeakSet[web.WebSocketResponse] = weakref.WeakSet()  # peers' links
        self._fast_port = fast_port
        self._loop = loop
        self._overflow: set[asyncio.Task[None]] = set()

    @property
    def rejected_frames(self) -> int:
        return self.refusals.total

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """GET LINK_PATH: a plain request learns this node's id (what a hello is addressed
        to); an upgrade request becomes a link if its hello authenticates, and is closed at
        once with the reason if not."""
        if not web.WebSocketResponse().can_prepare(request).ok:
            port = self._fast_port
            headers = {FAST_PORT_HEADER: str(port)} if port else None
            return web.Response(text=self._codec.sender, headers=headers)
        peer = request.remote or "?"
        try:
            open_hello(self._codec, request.headers.get(HELLO_HEADER))
        except FrameError as e:
            return await self._refuse(request, peer, e.counted_as("bad_hello"), str(e))
        socket = web.WebSocketResponse(
            heartbeat=self._config.heartbeat_s,
            max_msg_size=self._codec.limits.max_frame_bytes,
            compress=False,
        )
        await socket.prepare(request)
        self._open.add(socket)
        await socket.send_str(READY)
        async for message in socket:
            received = await self._decode(socket, peer, message)
            if received is None:
                break
            if not isinstance(received[0].message, LinkHello):
                await self.queue.put(received)
        return socket

    async def _refuse(
        self, request: web.Request, peer: str, reason: str, why: str
    ) -> web.StreamResponse:
        """Upgrade all the same, under a message cap of a few KiB, and close at once: what
        the stranger sent behind its request is then read by that websocket's parser, which
        refuses a large message from its declared size, instead of buffered and parsed again
        as HTTP (which costs several times its size in memory and log lines)."""
        self.refusals.refuse(reason, peer, why)
        socket = web.WebSocketResponse(
            max_msg_size=_REFUSED_MESSAGE_BYTES, timeout=_REFUSED_CLOSE_S, compress=False
        )
        await socket.prepare(request)
        await socket.close(code=_POLICY_VIOLATION, message=why[:120].encode())
        return socket

    def own_delivery(self, me: NodeId) -> Callable[[Message], Awaitable[None]]:
        """What this node's links call with a message to itself: it queues as if received
        (counter 0: the replay window guards sockets only), with no decoding time."""

        async def deliver(message: Message) -> None:
            await self.queue.put((Received(me, 0, message), 0.0, time.perf_counter()))

        return deliver

    def offer_threadsafe(self, received: Received, decode_ms: float, decoded_at: float) -> None:
        """Queue a frame from another thread (the compute thread's fast links), as if a
        websocket had brought it; a full queue makes it wait on the loop, not here."""
        if self._loop is None:
            raise RuntimeError("this inbox was built without the loop that reads it")
        item = (received, decode_ms, decoded_at)
        try:
            self._loop.call_soon_threadsafe(self._offer, item)
        except RuntimeError:  # the loop has closed: the node is stopping
            log.debug("dropping a frame offered after the loop closed")

    def _offer(self, item: tuple[Received, float, float]) -> None:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            task = asyncio.create_task(self.queue.put(item), name="inbox-overflow")
            self._overflow.add(task)
            task.add_done_callback(self._overflow.discard)

    async def close_all(self) -> None:
        """Close every link peers hold open to this node (it leaves): the entries watching
        them re-route at once. A peer that sends again opens a new one."""
        await asyncio.gather(
            *(s.close(code=aiohttp.WSCloseCode.GOING_AWAY) for s in list(self._open))
        )

    async def _decode(
        self, socket: web.WebSocketResponse, peer: str, message: aiohttp.WSMessage
    ) -> tuple[Received, float, float] | None:
        if message.type is not aiohttp.WSMsgType.BINARY:
            # a close or a missed heartbeat ends the link without a refusal; text is one, and
            # so is a message over the frame limit (aiohttp refuses it from its declared size)
            if message.type is aiohttp.WSMsgType.TEXT:
                await self._reject(socket, peer, "bad_message", "text messages are not frames")
            elif message.type is aiohttp.WSMsgType.ERROR:
                await self._reject(socket, peer, "bad_message", str(socket.exception()))
            return None
        started = time.perf_counter()
        try:
            received = self._codec.decode(message.data)
        except FrameError as e:
            await self._reject(socket, peer, e.refusal, str(e))
            return None
        decoded = time.perf_counter()
        return received, (decoded - started) * 1000, decoded

    async def _reject(
        self, socket: web.WebSocketResponse, peer: str, reason: str, detail: str
    ) -> None:
        self.refusals.refuse(reason, peer, detail)
        await socket.close(code=_POLICY_VIOLATION, message=detail[:120].encode())
