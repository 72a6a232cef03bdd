"""Frames kept to replay, against two real node processes (harness/attacker.py): frames sealed
by a clock that runs ahead, of every kind a node opens (gossip, a link's hello, a link's
frame, a fast link's hello, a transfer request), are refused past `net.max_clock_ahead_s`;
those a node took, sealed a little ahead, are refused again after it restarts; and a join's
first frame, which cannot know its receiver's id, opens nowhere."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from harness import attacker
from harness.cluster import Cluster
from harness.polling import until
from swarm.membership.messages import PushPull
from swarm.membership.wire_format import message_to_wire
from swarm.net.fast_links import FAST_PORT_HEADER
from swarm.net.hello import HELLO_HEADER, READY, hello_header
from swarm.transfer.protocol import TRANSFER_PATH, Ask, Request, TransferCodec
from swarm.types import SessionId
from swarm.wire import (
    NODE_HEADER,
    CloseSession,
    FrameCodec,
    GossipFrame,
    LinkHello,
    NodeId,
    SwarmKeys,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
AHEAD = "ahead of this node's clock"
STARTED = "before this node started"


def _ahead(seconds: float) -> Callable[[], int]:
    return lambda: time.time_ns() + int(seconds * 1e9)


@dataclass
class Nodes:
    cluster: Cluster
    keys: SwarmKeys

    def address(self, i: int) -> str:
        return self.cluster.addresses[i]

    def url(self, path: str, i: int) -> str:
        return f"http://{self.cluster.addresses[i]}{path}"

    async def node_id(self, i: int) -> NodeId:
        async with aiohttp.ClientSession() as http, http.get(self.url("/link", i)) as reply:
            return NodeId(await reply.text())

    async def fast_port(self, i: int) -> int:
        async with aiohttp.ClientSession() as http, http.get(self.url("/link", i)) as reply:
            return int(reply.headers[FAST_PORT_HEADER])


@pytest.fixture(scope="module")
def nodes(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    folder = tmp_path_factory.mktemp("replays")
    cluster, _, secret = asyncio.run(attacker.start_tiny(tiny_folder, folder))
    try:
        attacker.add_node(cluster)
        cluster.start(1)
        asyncio.run(_members(cluster.addresses))
        yield Nodes(cluster, attacker.keys(secret))
    finally:
        cluster.stop()


async def _members(addresses: list[str]) -> None:
    """Until node 1 sees every node alive: it took node 0's gossip, so it is past its first
    moments, in which it refuses frames its previous run may have taken (the frame codec is
    made before the gossip one)."""

    async def alive() -> bool:
        members = (await attacker.status(addresses[1]))["members"]
        return sum(m["state"] == "alive" for m in members) == len(addresses)

    await until(alive, "node 1 seeing every node alive", 120, ignoring=(aiohttp.ClientError,))


async def _answers(address: str) -> bool:
    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://{address}/health") as r:
            return r.status in (200, 503)
    except aiohttp.ClientError:
        return False


@dataclass(frozen=True)
class Kept:
    """One frame of each kind, sealed by a key holder for one node."""

    gossip: bytes
    hello: str  # a link's, as its header carries it
    frame: bytes  # a link's
    fast_hello: bytes
    transfer: bytes


def _keep(keys: SwarmKeys, receiver: NodeId, clock_ns: Callable[[], int]) -> Kept:
    frames = FrameCodec(keys.frame, NodeId("mallory"), clock_ns=clock_ns)
    gossip = FrameCodec(keys.gossip, NodeId("mallory"), clock_ns=clock_ns)
    transfer = TransferCodec(keys.frame, NodeId("mallory"), clock_ns=clock_ns)
    return Kept(
        gossip=gossip.encode(CloseSession(SessionId("s")), receiver),
        hello=hello_header(frames, receiver),
        frame=frames.encode(CloseSession(SessionId("s")), receiver),
        fast_hello=frames.encode(LinkHello(), receiver, compress=False),
        transfer=transfer.seal_request(Request(Ask.INDEX, "any"), receiver)[1],
    )


async def _post(url: str, body: bytes) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.post(url, data=body) as reply:
        return reply.status, "" if reply.status == 200 else await reply.text()


async def _link(url: str, hello: str, frame: bytes | None = None) -> str:
    """READY and, after `frame`, "kept" where the link took it; else why it was closed (its
    hello, or the frame)."""
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(url, headers={HELLO_HEADER: hello}) as ws,
    ):
        first = await ws.receive(timeout=10)
        if first.type is not aiohttp.WSMsgType.TEXT:
            return f"hello refused: {first.extra}"
        assert first.data == READY
        if frame is None:
            return READY
        await ws.send_bytes(frame)
        try:
            closing = await ws.receive(timeout=1.0)  # a refused frame closes the link at once
        except TimeoutError:
            return "kept"
        return str(closing.extra)


def _fast_hello(host: str, port: int, hello: bytes) -> bytes:
    """What a fast link's listener answers `hello`: b"\\x01" taken, b"" closed."""
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(struct.pack(">I", len(hello)) + hello)
        try:
            return s.recv(1)
        except ConnectionResetError:
            return b""


async def _offer(nodes: Nodes, i: int, kept: Kept) -> list[str]:
    """Each kept frame sent to node i: what the node said of it."""
    fresh = FrameCodec(nodes.keys.frame, NodeId("mallory"))
    receiver = await nodes.node_id(i)
    host = nodes.address(i).rpartition(":")[0]
    fast = await asyncio.to_thread(_fast_hello, host, await nodes.fast_port(i), kept.fast_hello)
    return [
        (await _post(nodes.url("/gossip", i), kept.gossip))[1],
        await _link(nodes.url("/link", i), kept.hello),
        await _link(nodes.url("/link", i), hello_header(fresh, receiver), kept.frame),
        "taken" if fast == b"\x01" else "closed",
        "answered"
        if (got := await _post(nodes.url(TRANSFER_PATH, i), kept.transfer))[0] == 200
        else got[1],
    ]


async def test_frames_sealed_too_far_ahead_are_refused_of_every_kind(nodes: Nodes) -> None:
    """A peer whose clock runs 15 s ahead: every kind of its frames is refused, so none is
    there to be taken a second time after the receiver restarts."""
    kept = _keep(nodes.keys, await nodes.node_id(0), _ahead(15))
    said = await _offer(nodes, 0, kept)
    assert all(AHEAD in s for s in said[:3]), said
    assert said[3] == "closed" and AHEAD in said[4], said


async def test_frames_a_node_took_are_refused_after_it_restarts(nodes: Nodes) -> None:
    """Sealed a little ahead (within the local preset's 0.5 s), taken by node 1, replayed
    after it restarted at once: refused, every kind."""
    kept = _keep(nodes.keys, await nodes.node_id(1), _ahead(0.4))
    said = await _offer(nodes, 1, kept)
    assert "where a GossipFrame belongs" in said[0], said  # opened: past the clock checks
    assert said[1:] == [READY, "kept", "taken", "answered"], said
    nodes.cluster.processes[1].kill()
    nodes.cluster.processes[1].wait()
    nodes.cluster.start(1)
    await _members(nodes.cluster.addresses)
    said = await _offer(nodes, 1, kept)
    assert STARTED in said[0] and STARTED in said[1], said
    assert STARTED in said[2] and not said[2].startswith("hello refused"), said
    assert said[3] == "closed" and STARTED in said[4], said


async def test_a_joins_first_frame_opens_nowhere(nodes: Nodes) -> None:
    """A joining node's first frame cannot name the id behind a bootstrap address: every node
    answers 421 with its id, and the joiner seals the frame again for it; so a frame
    captured on its way to one node is refused by the other, addressed or not."""
    gossip = FrameCodec(nodes.keys.gossip, NodeId("joiner"))
    join = PushPull(NodeId("joiner"), "127.0.0.1:9", (), join=True)
    unaddressed = gossip.encode(GossipFrame(*message_to_wire(join)))
    ids = [await nodes.node_id(i) for i in (0, 1)]
    async with aiohttp.ClientSession() as http:
        for i in (0, 1):
            async with http.post(nodes.url("/gossip", i), data=unaddressed) as reply:
                assert reply.status == 421 and reply.headers[NODE_HEADER] == ids[i]
        addressed = gossip.encode(GossipFrame(*message_to_wire(join)), ids[0])
        async with http.post(nodes.url("/gossip", 1), data=addressed) as reply:
            assert reply.status == 421 and reply.headers[NODE_HEADER] == ids[1]
        async with http.post(nodes.url("/gossip", 0), data=addressed) as reply:
            assert reply.status == 204, await reply.text()
