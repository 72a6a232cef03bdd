"""The node's listening socket with caps a stranger cannot talk past: open connections in all
and per peer address, connections per address that have not finished their first request's
headers, and a deadline for those headers. aiohttp's own keep-alive timeout closes connections
idle between requests; this closes the ones that never finish a request line (silent sockets,
a byte a second) or whose headers run over the limits, and refuses the ones over a cap, before
aiohttp allocates anything for them.

One address reads only a few connections that have shown nothing yet at a time, whatever the
cap in all; its further new connections wait their turn unread (a client's burst of a few
hundred requests opens them all before any has sent its headers), within the per-address cap
and the same header deadline, so a slow sender holds file descriptors, never the reading.

Every connection passes through `_Gated`, a thin protocol in front of aiohttp's request
handler that forwards each event to it once the connection is admitted."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import resource
import socket
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from swarm.logs import Refusals

log = logging.getLogger(__name__)

_HEADERS_END = b"\r\n\r\n"
# bytes a connection may send before the end of its first request's headers: aiohttp's own
# caps (8190 bytes a line, 64 headers) are checked only as it parses, and its errors are costly
_MAX_HEAD_BYTES = 32 * 1024
_MAX_LINE_BYTES = 8190  # bytes of one header line: aiohttp's own limit, met here first
# descriptors a node needs besides its listening connections: model files, outbound links,
# gossip's client pool, the compute thread's pipes
_SPARE_DESCRIPTORS = 256


@dataclass(frozen=True)
class ConnectionCaps:
    max_connections: int  # open connections, all addresses
    max_per_address: int  # open connections from one address
    header_timeout_s: float  # seconds to the end of the first request's headers
    max_unfinished_per_address: int  # connections from one address before their headers end


class Admission(enum.Enum):
    READ = "read"  # admitted, and read at once
    WAIT = "wait"  # admitted, read once one of its address's unfinished connections is done
    REFUSED = "refused"  # over a cap: closed at once


class ConnectionGate:
    """Counts open connections by peer address and decides who gets in, and when each is read."""

    def __init__(self, caps: ConnectionCaps, refusals: Refusals) -> None:
        self.caps = caps
        self.refusals = refusals
        self._open: Counter[str] = Counter()
        self._unfinished: Counter[str] = Counter()  # connections read whose first headers are due
        self._waiting: dict[str, deque[_Gated]] = {}  # admitted, not read yet, oldest first
        self.total = 0

    def admit(self, address: str) -> Admission:
        """Count a new connection from `address` in, or refuse it (counted by reason)."""
        if self.total >= self.caps.max_connections:
            self.refusals.refuse("connections", address, f"{self.total} connections open, the cap")
            return Admission.REFUSED
        if self._open[address] >= self.caps.max_per_address:
            self.refusals.refuse(
                "connections_per_address",
                address,
                f"{self._open[address]} connections open from this address, the cap",
            )
            return Admission.REFUSED
        self._open[address] += 1
        self.total += 1
        if self._unfinished[address] >= self.caps.max_unfinished_per_address:
            return Admission.WAIT
        self._unfinished[address] += 1
        return Admission.READ

    def wait(self, connection: _Gated) -> None:
        self._waiting.setdefault(connection.address, deque()).append(connection)

    def stop_waiting(self, connection: _Gated) -> None:
        """A waiting connection closed or was cut before its turn."""
        queue = self._waiting.get(connection.address)
        if queue is not None and connection in queue:
            queue.remove(connection)
            if not queue:
                del self._waiting[connection.address]

    def headers_ended(self, address: str) -> None:
        """A connection read's first headers ended, or it closed before they did: the oldest
        connection waiting from the same address is read in its place."""
        self._unfinished[address] -= 1
        if self._unfinished[address] <= 0:
            del self._unfinished[address]
        queue = self._waiting.get(address)
        if queue:
            turn = queue.popleft()
            if not queue:
                del self._waiting[address]
            self._unfinished[address] += 1
            turn.read()

    def release(self, address: str) -> None:
        self.total -= 1
        self._open[address] -= 1
        if self._open[address] <= 0:
            del self._open[address]

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Gated(self, inner)


class _Gated(asyncio.Protocol):
    """One connection: admitted or aborted in connection_made, then aiohttp's handler sees
    every event once it is read (at once, or after waiting its turn); closed when its first
    headers are late."""

    def __init__(self, gate: ConnectionGate, inner: Callable[[], asyncio.Protocol]) -> None:
        self._gate = gate
        self._make_inner = inner
        self._inner: asyncio.Protocol | None = None
        self.address = "?"
        self._admitted = False
        self._waiting = False  # admitted, not read yet: its turn comes from the gate
        self._waited = False  # it waited for its turn, whether it came or not
        self._deadline: asyncio.TimerHandle | None = None
        self._tail = b""  # the last bytes seen while waiting for the end of the headers
        self._head_bytes = 0  # bytes seen while waiting for the end of the headers
        self._line = 0  # bytes of the header line not ended yet
        self._cut = False  # aborted: what still arrives is dropped
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        admission = self._gate.admit(self.address)
        if admission is Admission.REFUSED:
            _abort(transport)
            return
        self._admitted = True
        self._transport = transport
        # the deadline runs from the connection's start, whether it is read now or later
        timeout = self._gate.caps.header_timeout_s
        self._deadline = asyncio.get_running_loop().call_later(timeout, self._late)
        if admission is Admission.WAIT:
            self._waiting = self._waited = True
            transport.pause_reading()  # type: ignore[attr-defined]
            self._gate.wait(self)
            return
        self._start_reading()

    def read(self) -> None:
        """This waiting connection's turn: read it. (One that closed or was cut has left
        the queue already: `_headers_ended`.)"""
        self._waiting = False
        assert self._transport is not None and not self._cut
        self._transport.resume_reading()  # type: ignore[attr-defined]
        self._start_reading()

    def _start_reading(self) -> None:
        assert self._transport is not None
        self._inner = self._make_inner()
        self._inner.connection_made(self._transport)

    def _late(self) -> None:
        self._headers_ended()
        if self._waited:
            # its address's unfinished connections held the reading past its deadline
            self._gate.refusals.refuse(
                "unfinished_headers",
                self.address,
                "waited past the header deadline behind this address's unfinished connections",
            )
        else:
            self._gate.refusals.refuse(
                "header_timeout", self.address, "request headers did not arrive in time"
            )
        self._abort()

    def _headers_ended(self) -> None:
        """Stop waiting for the first headers: they ended, or the connection is cut or gone."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
            if self._waiting:
                self._waiting = False
                self._gate.stop_waiting(self)
            else:
                self._gate.headers_ended(self.address)

    def _abort(self) -> None:
        self._cut = True
        if self._transport is not None:
            _abort(self._transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is None or self._cut:
            return
        if self._deadline is not None:
            # where the headers end, counted from the connection's first byte (-1: not yet)
            at = data.find(_HEADERS_END)
            if at < 0 and _HEADERS_END in self._tail + data[:3]:
                at = 0
            end = self._head_bytes + at if at >= 0 else -1
            self._head_bytes += len(data)
            too_long = end > _MAX_HEAD_BYTES or (end < 0 and self._head_bytes > _MAX_HEAD_BYTES)
            if too_long or self._longest_line(data if at < 0 else data[:at]) > _MAX_LINE_BYTES:
                self._too_long()
                return
            if end >= 0:
                self._headers_ended()
            else:
                self._tail = (self._tail + data[-3:])[-3:]
        self._inner.data_received(data)

    def _longest_line(self, data: bytes) -> int:
        """The longest header line `data` holds or ends, counting the line it continues."""
        lines = data.split(b"\n")
        longest = max(self._line + len(lines[0]), *(len(line) for line in lines[1:]))
        self._line = len(lines[-1]) if len(lines) > 1 else self._line + len(data)
        return longest

    def _too_long(self) -> None:
        """Cut a connection whose first headers run past _MAX_HEAD_BYTES, or one of whose
        lines does past _MAX_LINE_BYTES, before aiohttp parses them: its parser's errors quote
        the whole chunk they failed on, several times its size in memory and in the log."""
        self._headers_ended()
        self._gate.refusals.refuse(
            "headers_too_large", self.address, "request headers over this node's limits"
        )
        self._abort()

    def eof_received(self) -> bool | None:
        return None if self._inner is None else self._inner.eof_received()

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_ended()
        self._transport = None
        if self._admitted:
            self._admitted = False
            self._gate.release(self.address)
        if self._inner is not None:
            self._inner.connection_lost(exc)
            self._inner = None


def _abort(transport: asyncio.BaseTransport) -> None:
    """Close at once, dropping what is unsent. asyncio's socket transports and uvloop's both
    have `abort`, but uvloop's are no `asyncio.Transport` (nor `BaseTransport`), so this asks
    the transport, not its class."""
    abort = getattr(transport, "abort", None)
    with contextlib.suppress(Exception):
        (abort if callable(abort) else transport.close)()


class GatedSite(web.BaseSite):
    """aiohttp's TCPSite, each connection passed through a `ConnectionGate`."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, gate: ConnectionGate) -> None:
        """`sock`: bound, not listening yet (the node binds its port before it loads)."""
        super().__init__(runner, backlog=1024)
        self._sock = sock
        self._gate = gate

    @property
    def name(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    async def start(self) -> None:
        await super().start()
        server: Any = self._runner.server
        self._server = await asyncio.get_running_loop().create_server(
            self._gate.factory(server), sock=self._sock, backlog=self._backlog
        )


def raise_descriptor_limit(caps: ConnectionCaps) -> ConnectionCaps:
    """Raise RLIMIT_NOFILE's soft limit (up to the hard one) to what the connection caps need,
    so a flood meets the cap and not the process's limit; where the hard limit is lower, lower
    the cap to fit instead, and say so."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = caps.max_connections + _SPARE_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return caps
    fits = max(soft // 2, soft - _SPARE_DESCRIPTORS)
    log.warning(
        "the open-file limit is %d (ulimit -n): serving at most %d connections instead of "
        "net.max_connections = %d",
        soft,
        fits,
        caps.max_connections,
    )
    return dataclasses.replace(
        caps, max_connections=fits, max_per_address=min(caps.max_per_address, fits)
    )
