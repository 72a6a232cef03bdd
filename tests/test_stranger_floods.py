"""Floods from strangers without the key against two real node processes that split the model
(harness/attacker.py): bodies trickled into the peer routes, headers over the limits, and
connections that never finish their headers, each from a few addresses. The members keep
gossiping, completions through both nodes keep their text, and every stranger's connection
is cut within its short deadline."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from harness import attacker
from harness.cluster import Cluster
from harness.polling import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CAPS = {
    "max_connections": 200,
    "max_connections_per_address": 48,
    "header_timeout_s": 3.0,
    "max_unfinished_per_address": 8,
    "idle_timeout_s": 5.0,
    "unauthenticated_body_timeout_s": 1.0,
    "max_unauthenticated": 8,
    "max_unauthenticated_per_address": 2,
}
SOURCES = [f"127.0.3.{i}" for i in range(1, 5)]  # the strangers' addresses


@dataclass
class Split:
    cluster: Cluster
    reference: str  # what a completion got before any attack

    def url(self, path: str, i: int = 0) -> str:
        return f"http://{self.cluster.addresses[i]}{path}"

    async def refusals(self, i: int = 0) -> dict[str, int]:
        got: dict[str, int] = (await attacker.status(self.cluster.addresses[i]))["refusals"]
        return got


@pytest.fixture(scope="module")
def split(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    folder = tmp_path_factory.mktemp("floods")
    runtime, secret = attacker.tiny_swarm(tiny_folder, folder)
    layers = json.loads((tiny_folder / "config.json").read_text())["num_hidden_layers"]
    cluster = asyncio.run(attacker.start_split(runtime, folder, secret, CAPS, layers))
    try:
        reference = asyncio.run(attacker.complete(cluster.addresses[0]))
        yield Split(cluster, reference)
    finally:
        cluster.stop()


async def _member_states(address: str) -> set[str]:
    return {m["state"] for m in (await attacker.status(address))["members"]}


async def test_trickled_gossip_bodies_hold_no_members_gossip(split: Split) -> None:
    """16 bodies trickled into /gossip from 4 addresses, on each node, for several failure
    detection times: each is cut with 408 within its deadline, those over an address's
    share are refused at once, and meanwhile the members see each other alive and
    completions through both of them get their text."""
    seen: set[str] = set()
    cut: list[tuple[bytes, float]] = []
    stop = asyncio.Event()

    async def flood(address: str, source: str) -> None:
        while not stop.is_set():
            cut.append(await attacker.trickle(address, source))
            await asyncio.sleep(0.05)  # refused at once: no busy loop on a small machine

    async def watch() -> None:
        while not stop.is_set():
            for address in split.cluster.addresses:
                seen.update(await _member_states(address))
            await asyncio.sleep(0.1)

    started = time.monotonic()
    async with asyncio.TaskGroup() as group:
        for address in split.cluster.addresses:
            for source in SOURCES:
                for _ in range(4):
                    group.create_task(flood(address, source))
        group.create_task(watch())
        # a node is declared dead within ~2 s of silence (the local preset): go on longer
        while time.monotonic() - started < 6.0:
            assert await attacker.complete(split.cluster.addresses[0]) == split.reference
        stop.set()
    assert "dead" not in seen, f"members were seen {seen} while strangers trickled"
    answered = [line for line, _ in cut]
    assert any(a.startswith(b"HTTP/1.1 408") for a in answered), answered[:8]
    late = [s for line, s in cut if line.startswith(b"HTTP/1.1 408") and s > 6.0]
    assert not late, f"trickles held for {late} s, past their 1 s deadline"
    refusals = await split.refusals()
    assert refusals.get("body_timeout", 0) > 0 and refusals.get("busy", 0) > 0, refusals


async def test_headers_over_the_limit_are_cut_and_their_descriptors_freed(split: Split) -> None:
    """Over-limit headers from 4 addresses, 8 at a time each, many rounds: each connection is
    closed once its headers pass the limit (none waits for a deadline: the cut cancels it),
    and the node's descriptors come back down."""
    pid = split.cluster.processes[0].pid
    before = attacker.open_descriptors(pid)
    head = b"GET /status HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 40_000
    for _ in range(6):
        sockets = [
            s
            for source in SOURCES
            for s in attacker.open_sockets(split.cluster.addresses[0], source, 8)
        ]
        try:
            for s in sockets:
                s.sendall(head)
            await until(
                lambda sockets=sockets: all(attacker.closed_by_peer(s) for s in sockets),
                "the node closing every connection whose headers ran over",
                20,
            )
        finally:
            attacker.close_all(sockets)
    assert (await split.refusals()).get("headers_too_large", 0) >= 6 * 4 * 8
    await until(
        lambda: attacker.open_descriptors(pid) <= before + 16,
        lambda: f"node 0's descriptors back near {before}: {attacker.open_descriptors(pid)}",
        20,
    )
    assert await attacker.complete(split.cluster.addresses[0]) == split.reference


async def test_unfinished_headers_are_capped_per_address(split: Split) -> None:
    """30 connections from each of 4 addresses that never finish their headers: each address
    is read on only `max_unfinished_per_address` of them, the rest wait unread (counted as
    refused for unfinished headers when the deadline cuts them), another address is served
    meanwhile, and all are closed at the header deadline."""
    before = (await split.refusals()).get("unfinished_headers", 0)
    address = split.cluster.addresses[0]
    sockets = [s for source in SOURCES for s in attacker.open_sockets(address, source, 30)]
    try:
        assert len(sockets) == 4 * 30
        for s in sockets:
            s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n")
        refused = 4 * (30 - int(CAPS["max_unfinished_per_address"]))

        async def counted() -> bool:
            return (await split.refusals()).get("unfinished_headers", 0) - before >= refused

        await until(counted, f"{refused} connections refused for unfinished headers", 20)
        async with aiohttp.ClientSession() as http, http.get(split.url("/health")) as reply:
            assert reply.status == 200
        await until(
            lambda: all(attacker.closed_by_peer(s) for s in sockets),
            "the node closing the connections held past the header deadline",
            20,
        )
    finally:
        attacker.close_all(sockets)
    assert await attacker.complete(address) == split.reference
