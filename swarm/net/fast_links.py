"""Fast links: a plain TCP connection per peer beside its websocket link, read and written by
the compute threads, so that a decode step's frame goes from one hop's compute thread to the
next one's without either event loop (the websocket path costs a hop three thread wake-ups:
`swarm/runtime/execution/worker.py` says why that matters).

The frames are the links' own (`FrameCodec`: authenticated, addressed, replay-checked), each
behind its length in 4 bytes, checked against the frame limit before it is buffered. A
connection opens with a hello frame addressed to the receiver, as a websocket link's upgrade
carries one, and the receiver answers one byte before it takes any other frame; a stranger's
connection is closed. The websocket link stays: it carries everything else (probes, closes,
gossip's links) and its heartbeat and close are what the entry watches. Fast links carry
decode and verify steps, results and errors only (`travels_fast`), and a node without one
(its peer's port is blocked, or it has none) sends the same frames over the websocket.

Who uses what: the listener accepts and checks hellos on the event loop, then hands the
socket to the compute thread (`ComputeThread.watch`), where `FrameReader` splits its bytes
into frames. Outbound connections are opened on the event loop when a peer's websocket link
says its fast port; afterwards the compute thread sends on them with a blocking write bounded
by `net.send_timeout_s` (at most 2 s), and the event loop only where the whole frame fits in
the socket's buffer at once (it never waits on a peer)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from swarm.config import NetConfig
from swarm.errors import FrameError
from swarm.logs import Refusals
from swarm.runtime.execution.compute import ComputeThread
from swarm.types import NodeId
from swarm.wire import (
    ErrorMessage,
    FrameCodec,
    LinkHello,
    Message,
    Received,
    ResultMessage,
    StepMessage,
)
from swarm.wire.native_frames import SpareTensor

log = logging.getLogger(__name__)

FAST_PORT_HEADER = "X-Swarm-Fast-Port"  # in a link path's plain GET answer: this node's port
_LENGTH = struct.Struct(">I")
_ACCEPTED = b"\x01"
_HELLO_BYTES = 4096  # a hello frame's most bytes
_RECV_BYTES = 256 * 1024
_LOOP_SEND_BYTES = 64 * 1024  # frames the event loop may write itself (a decode step's)
_THREAD_SEND_S = 2.0  # seconds the compute thread waits at most for a peer to take a frame
_RETRY_S = 30.0  # seconds before a peer whose fast port failed is tried again


def travels_fast(message: Message) -> bool:
    """Decode and verify steps, results and errors go on fast links; prefill chunks on the
    websocket. An entry sends a prefill's chunks one behind the other without waiting, so
    they must keep their order: a short last chunk on a fast link would overtake the one
    before it on the websocket. Nothing of a session is in flight when its next decode or
    verify step leaves (the last step's result has come back from the last hop), so those
    may take the other way, and a hop's compute thread runs them with the other streams'."""
    if isinstance(message, StepMessage):
        return message.hidden.shape[1] == 1 or message.verify
    return isinstance(message, (ResultMessage, ErrorMessage))


# A frame from a fast link, on the compute thread: (the frame, ms decoding it, perf_counter then)
FrameSink = Callable[[Received, float, float], None]


class FrameReader:
    """The compute thread's side of one accepted connection: reads what arrived, decodes each
    whole frame and hands it to `sink`. A bad frame or length closes this connection only."""

    def __init__(
        self,
        sock: socket.socket,
        peer: str,
        codec: FrameCodec,
        sink: FrameSink,
        refusals: Refusals,
        on_close: Callable[[socket.socket], None],
        spare: SpareTensor | None = None,
    ) -> None:
        self._sock = sock
        self._spare = spare
        self._peer = peer
        self._codec = codec
        self._sink = sink
        self._refusals = refusals
        self._on_close = on_close
        self._buffer = bytearray()

    def read(self) -> bool:
        try:
            data = self._sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return self._close()
        if not data:
            return self._close()
        self._buffer += data
        return self._frames()

    def _frames(self) -> bool:
        limit = self._codec.limits.max_frame_bytes
        while len(self._buffer) >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(self._buffer)
            if size > limit:
                self._refusals.refuse("bad_frame", self._peer, f"a frame of {size} bytes")
                return self._close()
            end = _LENGTH.size + size
            if len(self._buffer) < end:
                return True
            frame = bytes(memoryview(self._buffer)[_LENGTH.size : end])
            del self._buffer[:end]
            started = time.perf_counter()
            try:
                received = self._codec.decode(frame, spare=self._spare)
            except FrameError as e:
                self._refusals.refuse(e.refusal, self._peer, str(e))
                return self._close()
            decoded = time.perf_counter()
            self._sink(received, (decoded - started) * 1000, decoded)
        return True

    def _close(self) -> bool:
        self._on_close(self._sock)
        return False


class FastListener:
    """Accepts peers' fast links on the event loop and hands each, once its hello opens, to
    the compute thread."""

    def __init__(
        self,
        codec: FrameCodec,
        config: NetConfig,
        compute: ComputeThread,
        sink: FrameSink,
        refusals: Refusals,
        listener: socket.socket,
    ) -> None:
        """`listener`: bound and listening (`swarm.net.ports`); it accepts there."""
        self._codec = codec
        self._config = config
        self._compute = compute
        self._sink = sink
        self.refusals = refusals
        listener.setblocking(False)
        self._listener = listener
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()  # _open is changed by both threads
        self._tasks: set[asyncio.Task[None]] = set()
        self.port: int = listener.getsockname()[1]
        # the readers' tensor made ahead (they all run on the compute thread)
        self._spare = SpareTensor()

    async def accept(self) -> None:
        """Take peers' connections until cancelled."""
        loop = asyncio.get_running_loop()
        listener = self._listener
        while True:
            sock, address = await loop.sock_accept(listener)
            peer = str(address[0])
            with self._lock:
                full = len(self._open) + len(self._tasks) >= self._config.max_connections
            if full:
                self.refusals.refuse("too_many_links", peer, "fast links are at their cap")
                sock.close()
                continue
            task = asyncio.create_task(self._greet(sock, peer), name=f"fast-hello {peer}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _greet(self, sock: socket.socket, peer: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._config.header_timeout_s):
                head = await _read_exactly(loop, sock, _LENGTH.size)
                (size,) = _LENGTH.unpack(head)
                if size > _HELLO_BYTES:
                    raise FrameError(f"a hello of {size} bytes")
                self._codec.decode(await _read_exactly(loop, sock, size), expect=LinkHello)
                await loop.sock_sendall(sock, _ACCEPTED)
        except (FrameError, OSError, TimeoutError, EOFError) as e:
            reason = e.counted_as("bad_hello") if isinstance(e, FrameError) else "bad_hello"
            self.refusals.refuse(reason, peer, str(e) or type(e).__name__)
            sock.close()
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._open.add(sock)
        reader = FrameReader(
            sock, peer, self._codec, self._sink, self.refusals, self._closed, self._spare
        )
        self._compute.watch(sock, reader.read)

    def refill(self) -> None:
        """On the compute thread, once a round's frames have gone on: the readers' next
        tensor, made while nothing waits for it."""
        self._spare.refill()

    def _closed(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)
        sock.close()

    def close_all(self) -> None:
        """Shut every accepted link (this node leaves); the compute thread's readers then see
        them end and let go."""
        with self._lock:
            socks = list(self._open)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.close_all()
        self._listener.close()


async def _read_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = await loop.sock_recv(sock, n - len(data))
        if not chunk:
            raise EOFError("closed before its hello")
        data += chunk
    return bytes(data)


@dataclass
class _Outbound:
    sock: socket.socket
    receiver: NodeId
    lock: threading.Lock  # one writer at a time: the compute thread or the event loop


class FastLinks:
    """Outbound fast links by peer address. `learn` (event loop) opens one when a peer's
    websocket link said its fast port; `send` writes a frame on it from either thread, or
    answers False, and the caller sends over the websocket instead."""

    def __init__(self, codec: FrameCodec, config: NetConfig) -> None:
        self._codec = codec
        self._config = config
        self._links: dict[str, _Outbound] = {}
        self._failed: dict[str, float] = {}  # address: monotonic time its link last failed
        self._opening: dict[str, asyncio.Task[None]] = {}

    def learn(self, address: str, receiver: NodeId, port: int) -> None:
        """The peer at `address` (its HTTP address) is `receiver` and takes fast links on
        `port`: open one in the background, unless one is open or opening, or failed lately."""
        if address in self._links or address in self._opening:
            return
        if time.monotonic() - self._failed.get(address, -_RETRY_S) < _RETRY_S:
            return
        task = asyncio.create_task(self._open(address, receiver, port), name=f"fast {address}")
        self._opening[address] = task
        task.add_done_callback(lambda _: self._opening.pop(address, None))

    def has(self, address: str) -> bool:
        return address in self._links

    def send(self, address: str, message: Message, *, wait: bool) -> bool:
        """Write `message` to `address` if a fast link is open: `wait` (the compute thread)
        blocks up to `net.send_timeout_s`; without it (the event loop) only a frame that fits
        in the socket's buffer at once is written. False: not sent, use the websocket (a link
        that broke or stalled mid-frame is closed, so the peer never reads half a frame)."""
        link = self._links.get(address)
        if link is None or not travels_fast(message):
            return False
        data = self._codec.encode(message, link.receiver)
        frame = _LENGTH.pack(len(data)) + data
        if not wait and len(frame) > _LOOP_SEND_BYTES:
            return False
        if not link.lock.acquire(blocking=wait):
            return False
        try:
            if wait:
                link.sock.sendall(frame)
            else:
                sent = os.write(link.sock.fileno(), frame)  # the socket is non-blocking
                if sent < len(frame):
                    raise BlockingIOError(f"{sent} of {len(frame)} bytes fit")
            return True
        except OSError as e:  # BlockingIOError and TimeoutError included
            log.info("fast link to %s broke (%s); sending over its websocket", address, e)
            self._drop(address, link)
            return False
        finally:
            link.lock.release()

    def forget(self, address: str) -> None:
        """The peer's websocket link dropped: its fast link goes too (a restarted peer at the
        same address takes a new one)."""
        link = self._links.pop(address, None)
        if link is None:
            return
        if link.lock.acquire(blocking=False):
            try:
                link.sock.close()
            finally:
                link.lock.release()
        else:  # the compute thread is writing on it: that write fails and closes it
            with contextlib.suppress(OSError):
                link.sock.shutdown(socket.SHUT_RDWR)

    def _drop(self, address: str, link: _Outbound) -> None:
        if self._links.get(address) is link:
            del self._links[address]
            self._failed[address] = time.monotonic()
        with contextlib.suppress(OSError):
            link.sock.close()

    async def _open(self, address: str, receiver: NodeId, port: int) -> None:
        host = address.rpartition(":")[0].strip("[]")
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            async with asyncio.timeout(self._config.connect_timeout_s):
                await loop.sock_connect(sock, (host, port))
                hello = self._codec.encode(LinkHello(), receiver, compress=False)
                await loop.sock_sendall(sock, _LENGTH.pack(len(hello)) + hello)
                if await loop.sock_recv(sock, 1) != _ACCEPTED:
                    raise ConnectionError("the peer refused the hello")
        except (OSError, TimeoutError) as e:
            log.info("no fast link to %s port %d (%s); using its websocket", address, port, e)
            self._failed[address] = time.monotonic()
            sock.close()
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # the compute thread writes decode and verify steps only (a few rows of hidden
        # states, at most 1 + speculation.max_draft_tokens): a peer that takes none
        # for this long is stalled, and the thread, which runs every job of this node, must
        # not wait on it any longer; the fd stays non-blocking underneath
        sock.settimeout(min(self._config.send_timeout_s, _THREAD_SEND_S))
        self._links[address] = _Outbound(sock, receiver, threading.Lock())

    async def close(self) -> None:
        for task in list(self._opening.values()):
            task.cancel()
        await asyncio.gather(*self._opening.values(), return_exceptions=True)
        for address, link in list(self._links.items()):
            self._drop(address, link)
