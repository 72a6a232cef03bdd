"""The connection gate on fake transports: a burst from one address is read a few at a time,
the rest wait their turn unread; the caps in all and per address still refuse; a waiting
connection that closes or runs past the header deadline gives its place up."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from swarm.api.connections import ConnectionCaps, ConnectionGate
from swarm.logs import Refusals

CAPS = ConnectionCaps(
    max_connections=12, max_per_address=10, header_timeout_s=0.2, max_unfinished_per_address=2
)
REQUEST = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


class _Transport:
    def __init__(self, address: str) -> None:
        self.address = address
        self.reading = True
        self.aborted = False

    def get_extra_info(self, name: str) -> Any:
        return (self.address, 40000) if name == "peername" else None

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def abort(self) -> None:
        self.aborted = True


class _Handler(asyncio.Protocol):
    """What aiohttp's handler would see."""

    def __init__(self) -> None:
        self.made = False
        self.received = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made = True

    def data_received(self, data: bytes) -> None:
        self.received += data

    def connection_lost(self, exc: Exception | None) -> None:
        pass


def _connect(
    gate: ConnectionGate, address: str, n: int
) -> list[tuple[Any, _Transport, list[_Handler]]]:
    opened = []
    for _ in range(n):
        handlers: list[_Handler] = []

        def make(handlers: list[_Handler] = handlers) -> _Handler:
            handlers.append(_Handler())
            return handlers[-1]

        protocol = gate.factory(make)()
        transport = _Transport(address)
        protocol.connection_made(transport)  # type: ignore[arg-type]
        opened.append((protocol, transport, handlers))
    return opened


def _gate() -> ConnectionGate:
    return ConnectionGate(CAPS, Refusals(logging.getLogger("test"), "a connection"))


async def test_a_burst_from_one_address_is_read_a_few_at_a_time_and_all_answered() -> None:
    gate = _gate()
    burst = _connect(gate, "10.0.0.1", 6)
    assert [t.reading for _, t, _ in burst] == [True, True, False, False, False, False]
    assert [bool(h) for _, _, h in burst] == [True, True, False, False, False, False]
    for i, (protocol, transport, handlers) in enumerate(burst):
        assert transport.reading, i  # its turn came when an earlier one's headers ended
        protocol.data_received(REQUEST)
        assert handlers[0].received == REQUEST
    assert not any(t.aborted for _, t, _ in burst)
    assert gate.refusals.counts == {}


async def test_another_address_is_read_while_one_waits() -> None:
    gate = _gate()
    _connect(gate, "10.0.0.1", 5)
    ((_, other, handlers),) = _connect(gate, "10.0.0.2", 1)
    assert other.reading and handlers[0].made


async def test_the_caps_in_all_and_per_address_still_refuse() -> None:
    gate = _gate()
    mine = _connect(gate, "10.0.0.1", 11)
    assert [t.aborted for _, t, _ in mine] == [False] * 10 + [True]
    theirs = _connect(gate, "10.0.0.2", 3)
    assert [t.aborted for _, t, _ in theirs] == [False, False, True]
    assert gate.refusals.counts == {"connections_per_address": 1, "connections": 1}
    for protocol, _, _ in mine[:10] + theirs[:2]:
        protocol.connection_lost(None)
    assert gate.total == 0


async def test_a_waiting_connection_that_closes_gives_its_place_up() -> None:
    gate = _gate()
    (first, _, _), _, (waiting, waiting_transport, _), (_, last_transport, _) = _connect(
        gate, "10.0.0.1", 4
    )
    waiting.connection_lost(None)
    first.data_received(REQUEST)
    assert last_transport.reading and not waiting_transport.reading
    assert gate.total == 3


async def test_connections_that_wait_past_the_deadline_are_cut_as_unfinished() -> None:
    gate = _gate()
    opened = _connect(gate, "10.0.0.1", 5)
    await asyncio.sleep(CAPS.header_timeout_s * 2)
    assert all(t.aborted for _, t, _ in opened)
    assert gate.refusals.counts == {"header_timeout": 2, "unfinished_headers": 3}
    for protocol, _, _ in opened:
        protocol.connection_lost(None)
    assert gate.total == 0
