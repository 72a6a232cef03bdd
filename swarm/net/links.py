"""Outbound links: one persistent websocket per peer address, opened on first use, reopened
after a failure on the next send. aiohttp's own compression is off because frames carry lz4.
A message to this node's own address never touches a socket: it goes straight to its inbox
(an entry serving the first layers is its own first hop, and often its own last)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import aiohttp

from swarm.config import NetConfig
from swarm.errors import LinkError
from swarm.net.fast_links import FAST_PORT_HEADER, FastLinks
from swarm.net.hello import HELLO_HEADER, MAX_NODE_ID_BYTES, READY, hello_header
from swarm.types import NodeId
from swarm.wire import FrameCodec, Message

log = logging.getLogger(__name__)

LINK_PATH = "/link"
_INBOUND_MESSAGE_BYTES = 4096  # bytes of one message a peer may send on an outbound link


class Links:
    def __init__(self, codec: FrameCodec, config: NetConfig, fast: FastLinks | None = None) -> None:
        self._codec = codec
        self._config = config
        self.fast = fast  # steps, results and errors go on a peer's fast link where one is open
        self._fast_ports: dict[str, tuple[NodeId, int]] = {}  # address: its id and fast port
        self._http: aiohttp.ClientSession | None = None
        self._sockets: dict[str, aiohttp.ClientWebSocketResponse] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        self._readers: set[asyncio.Task[None]] = set()
        self._closed: dict[str, asyncio.Future[None]] = {}  # per open socket: done when it drops
        self._receivers: dict[str, NodeId] = {}  # per open socket: the node id its peer said
        self._own_address: str | None = None
        self._deliver_own: Callable[[Message], Awaitable[None]] | None = None
        self._own_link: asyncio.Future[None] | None = None  # never drops while the node runs

    def loop_back(self, address: str, deliver: Callable[[Message], Awaitable[None]]) -> None:
        """Hand messages to `address` (this node's own) to `deliver` instead of a socket:
        no encoding, compression, authentication or copies for a frame that stays here."""
        self._own_address, self._deliver_own = address, deliver

    def send_now(self, address: str, message: Message, *, wait: bool = False) -> bool:
        """Write `message` on the peer's fast link if one is open: the one place a frame
        leaves without the event loop, whichever thread sends it. Without `wait` (the event
        loop) only if its socket takes the whole frame at once (a decode step's does); with it
        (the compute thread) waiting up to `net.send_timeout_s`. False: not sent, `send` it
        on the loop."""
        return (
            address != self._own_address
            and self.fast is not None
            and self.fast.send(address, message, wait=wait)
        )

    def fast_link_open(self, address: str) -> bool:
        """Whether a fast link to the peer at `address` is open now."""
        return self.fast is not None and self.fast.has(address)

    async def send(self, address: str, message: Message) -> None:
        """Send one message; LinkError when the peer cannot be reached or the link broke."""
        if address == self._own_address and self._deliver_own is not None:
            await self._deliver_own(message)
            return
        if self.send_now(address, message):
            return
        if self.fast is not None:
            known = self._fast_ports.get(address)
            if known is not None:  # reopen a fast link that broke (at most every few seconds)
                self.fast.learn(address, *known)
        socket = await self._socket(address)
        data = self._codec.encode(message, self._receivers[self._key(address, socket)])
        try:
            async with asyncio.timeout(self._config.send_timeout_s):
                await socket.send_bytes(data)
        except (aiohttp.ClientError, ConnectionError, RuntimeError, TimeoutError) as e:
            await self._drop(address, socket)
            raise LinkError(
                f"link to {address} broke while sending: {e or type(e).__name__}"
            ) from None

    async def watch(self, address: str) -> asyncio.Future[None]:
        """A future that completes when the link to `address` drops: the peer closed it, its
        process died (the kernel closes its sockets), or it missed websocket heartbeats. Opens
        the link if needed; LinkError when the peer cannot be reached."""
        if address == self._own_address:
            if self._own_link is None:
                self._own_link = asyncio.get_running_loop().create_future()
            return self._own_link
        socket = await self._socket(address)
        return self._closed[self._key(address, socket)]

    @staticmethod
    def _key(address: str, socket: aiohttp.ClientWebSocketResponse) -> str:
        return f"{address}#{id(socket)}"

    async def _socket(self, address: str) -> aiohttp.ClientWebSocketResponse:
        socket = self._sockets.get(address)
        if socket is not None and not socket.closed:
            return socket
        lock = self._connecting.setdefault(address, asyncio.Lock())
        async with lock:
            socket = self._sockets.get(address)
            if socket is not None and not socket.closed:
                return socket
            socket, receiver = await self._connect(address)
            self._sockets[address] = socket
            self._receivers[self._key(address, socket)] = receiver
            self._closed[self._key(address, socket)] = asyncio.get_running_loop().create_future()
            reader = asyncio.create_task(
                self._drain(address, socket), name=f"link-reader {address}"
            )
            self._readers.add(reader)
            reader.add_done_callback(self._readers.discard)
            return socket

    async def _connect(self, address: str) -> tuple[aiohttp.ClientWebSocketResponse, NodeId]:
        """Open a link: ask the peer's node id (frames are addressed to it, so a captured frame
        is refused by any other node), then upgrade with a hello addressed to it, which proves
        the key before the peer takes any frame; the peer answers READY, or closes the link
        with the reason (swarm/net/hello.py)."""
        if self._http is None:
            self._http = aiohttp.ClientSession()
        url = f"http://{address}{LINK_PATH}"
        try:
            async with asyncio.timeout(self._config.connect_timeout_s):
                async with self._http.get(url) as reply:
                    size = reply.content_length or 0  # bounded before reading
                    small = reply.status == 200 and 0 < size <= MAX_NODE_ID_BYTES
                    receiver = _node_id(await reply.read()) if small else None
                    fast_port = _port(reply.headers.get(FAST_PORT_HEADER))
                if receiver is None:
                    raise LinkError(f"{address} did not say its node id ({reply.status})")
                socket = await self._http.ws_connect(
                    url,
                    heartbeat=self._config.heartbeat_s,
                    # peers send nothing on a link they did not open but pongs and a close
                    max_msg_size=_INBOUND_MESSAGE_BYTES,
                    compress=0,
                    headers={HELLO_HEADER: hello_header(self._codec, receiver)},
                )
                answer = await socket.receive()
                if answer.type is not aiohttp.WSMsgType.TEXT or answer.data != READY:
                    await socket.close()
                    why = answer.extra or answer.type.name
                    raise LinkError(f"{address} refused the link: {why}")
                if fast_port and self.fast is not None:
                    self._fast_ports[address] = (receiver, fast_port)
                    self.fast.learn(address, receiver, fast_port)
                return socket, receiver
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise LinkError(f"cannot reach {address}: {e or type(e).__name__}") from None

    async def _drain(self, address: str, socket: aiohttp.ClientWebSocketResponse) -> None:
        """Peers never answer on our outbound link, but reading is what processes pongs and
        notices a close; anything else on it is a protocol violation."""
        async for message in socket:
            if message.type is not aiohttp.WSMsgType.BINARY:
                continue
            log.warning("peer %s sent data on an outbound link; closing it", address)
            break
        await self._drop(address, socket)

    async def _drop(self, address: str, socket: aiohttp.ClientWebSocketResponse) -> None:
        if self._sockets.get(address) is socket:
            del self._sockets[address]
            if self.fast is not None:
                self.fast.forget(address)
        self._receivers.pop(self._key(address, socket), None)
        closed = self._closed.pop(self._key(address, socket), None)
        if closed is not None and not closed.done():
            closed.set_result(None)
        await socket.close()

    async def close(self) -> None:
        for address, socket in list(self._sockets.items()):
            await self._drop(address, socket)
        for reader in list(self._readers):
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
        if self.fast is not None:
            await self.fast.close()


def _port(said: str | None) -> int:
    """The fast port a peer's link path answered with; 0 when none or not a port."""
    if said is None or not said.isdigit():
        return 0
    port = int(said)
    return port if 0 < port < 65536 else 0


def _node_id(said: bytes) -> NodeId | None:
    """The node id a peer's link path answered with, None when that is not one."""
    try:
        return NodeId(said.decode("utf-8"))
    except UnicodeDecodeError:
        return None
