"""Round-trip probes over real links on loopback: a padded probe, its reply over the peer's own
link, the moving average routing reads, and a lost peer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import torch
from aiohttp import web

from swarm.config import NetConfig
from swarm.net.endpoint import Inbox
from swarm.net.links import LINK_PATH, Links
from swarm.net.probes import RoundTrips
from swarm.types import NodeId
from swarm.wire import FrameCodec, LinkProbe, Peer, ProbeReply, SwarmKeys, generate_secret

KEYS = SwarmKeys.derive(generate_secret())
CONFIG = NetConfig(connect_timeout_s=1.0, send_timeout_s=1.0, rtt_probes_per_interval=2)
STEP_BYTES = 64 * 1024


def test_probe_and_reply_cross_the_wire() -> None:
    sender, receiver = FrameCodec(KEYS.frame, NodeId("a")), FrameCodec(KEYS.frame, NodeId("b"))
    padding = torch.randn(1, 1, 16384)
    frame = sender.encode(LinkProbe(7, Peer(NodeId("a"), "10.0.0.1:7420"), padding), NodeId("b"))
    assert len(frame) > 64 * 1024  # random padding does not compress away
    got = receiver.decode(frame).message
    assert isinstance(got, LinkProbe) and got.seq == 7 and got.reply_to.node_id == "a"
    assert torch.equal(got.padding, padding)
    assert receiver.decode(sender.encode(ProbeReply(7), NodeId("b"))).message == ProbeReply(7)


class _Node:
    """A link endpoint and its round trips, with the inbox pump serve_inbox runs for probes."""

    def __init__(self, name: str) -> None:
        self.codec = FrameCodec(KEYS.frame, NodeId(name))
        self.links = Links(self.codec, CONFIG)
        self.inbox = Inbox(self.codec, CONFIG)
        self.name = NodeId(name)
        self.address = ""
        self.round_trips: RoundTrips | None = None

    async def start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_get(LINK_PATH, self.inbox.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.address = f"127.0.0.1:{port}"
        self.round_trips = RoundTrips(Peer(self.name, self.address), self.links, CONFIG, STEP_BYTES)
        return runner

    async def pump(self) -> None:
        assert self.round_trips is not None
        while True:
            received, _, _ = await self.inbox.queue.get()
            message = received.message
            if isinstance(message, LinkProbe):
                self.round_trips.answer(message)
            elif isinstance(message, ProbeReply):
                self.round_trips.resolve(received.sender, message)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[_Node, _Node]]:
    a, b = _Node("a"), _Node("b")
    runners = [await a.start(), await b.start()]
    pumps = [asyncio.create_task(a.pump()), asyncio.create_task(b.pump())]
    yield a, b
    for task in pumps:
        task.cancel()
    await asyncio.gather(*pumps, return_exceptions=True)
    for node in (a, b):
        await node.links.close()
    for runner in runners:
        await runner.cleanup()


async def test_round_trips_are_measured_and_averaged(pair: tuple[_Node, _Node]) -> None:
    a, b = pair
    assert a.round_trips is not None
    samples = [await a.round_trips.measure(b.name, b.address) for _ in range(3)]
    assert all(s is not None and 0 < s < 1000 for s in samples)
    average = a.round_trips.snapshot()[b.name]
    assert min(samples) <= average <= max(samples)  # type: ignore[type-var]


async def test_an_unreachable_peer_is_lost_not_averaged(pair: tuple[_Node, _Node]) -> None:
    a, _ = pair
    assert a.round_trips is not None
    assert await a.round_trips.measure(NodeId("gone"), "127.0.0.1:9") is None
    assert NodeId("gone") not in a.round_trips.snapshot()


def test_each_round_probes_a_few_peers_the_stalest_first_and_forgets_the_gone() -> None:
    links = Links(FrameCodec(KEYS.frame, NodeId("me")), CONFIG)
    trips = RoundTrips(Peer(NodeId("me"), "127.0.0.1:1"), links, CONFIG, STEP_BYTES)
    peers = [(NodeId(n), f"127.0.0.1:{i + 2}") for i, n in enumerate("abcde")]
    seen: list[NodeId] = []
    for _ in range(3):  # what run() does, without the waiting
        due = trips.due(peers)
        assert len(due) == 2  # rtt_probes_per_interval
        for node, _ in due:
            trips._measured_at[node] = len(seen)  # as measure() stamps it
            seen.append(node)
    assert seen[:5] == [NodeId(n) for n in "abcde"]  # everyone once before anyone twice
    assert trips.due(peers[3:]) == peers[3:]  # a, b and c left
    assert set(trips._measured_at) == {NodeId("d"), NodeId("e")}
