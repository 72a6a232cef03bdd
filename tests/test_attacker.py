"""A stranger on the LAN against two real node processes (harness/attacker.py sets them up): body
and connection floods, slow senders, strangers' links, replayed frames, malformed requests,
random frames. After every attack the node is up, its memory within RSS_GROWTH_BOUND of where
it started, and a normal request still gets the text it got before the attacks."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import attacker
from harness.cluster import Cluster
from harness.polling import until
from swarm.net.hello import HELLO_HEADER, READY, hello_header
from swarm.types import SessionId
from swarm.wire import (
    CloseSession,
    FrameCodec,
    NodeId,
    WireLimits,
    activation_limits,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
MIB = 1024 * 1024


@dataclass
class Target:
    cluster: Cluster
    secret: Path
    reference: str  # what a normal request got before any attack
    rss_before: int
    link_frame_bytes: int  # the largest frame node 0 takes on a link: its model's bound
    other_id: NodeId  # node 1's: frames sealed for it must open nowhere else
    # sealed for node 1 before node 1 started, at the start of the module: its start
    # overlaps the other attacks, all made against node 0
    captured: bytes

    @property
    def address(self) -> str:
        return self.cluster.addresses[0]

    @property
    def pid(self) -> int:
        return self.cluster.processes[0].pid

    def url(self, path: str, i: int = 0) -> str:
        return f"http://{self.cluster.addresses[i]}{path}"

    async def still_serves(self) -> None:
        assert self.cluster.processes[0].poll() is None, "the node died"
        assert await attacker.complete(self.address) == self.reference
        growth = attacker.rss(self.pid) - self.rss_before
        assert growth < attacker.RSS_GROWTH_BOUND, f"RSS grew by {growth >> 20} MiB"


@pytest.fixture(scope="module")
def target(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    folder = tmp_path_factory.mktemp("attacker")
    cluster, runtime, secret = asyncio.run(attacker.start_tiny(tiny_folder, folder))
    try:
        reference = asyncio.run(attacker.complete(cluster.addresses[0]))
        assert reference.strip(), "the reference request got no text"
        hidden = json.loads((tiny_folder / "config.json").read_text())["hidden_size"]
        bound = activation_limits(hidden, runtime.prefill_chunk_tokens, WireLimits())
        # node 1's id is on disk before it runs, as after an earlier run: a frame sealed for
        # it now stands for one captured before a restart (a node keeps no memory across one)
        b = attacker.add_node(cluster)
        captured = FrameCodec(attacker.keys(secret).gossip, NodeId("m")).encode(
            CloseSession(SessionId("s")), b
        )
        # a restart takes longer than the second of grace a node gives frames sealed just
        # before it started (a forked test node starts within it)
        time.sleep(1.5)
        cluster.start(1)
        pid = cluster.processes[0].pid
        rss = attacker.rss(pid)
        yield Target(cluster, secret, reference, rss, bound.max_frame_bytes, b, captured)
    finally:
        for process in cluster.processes:  # no graceful leave to wait for: the test is over
            process.kill()
            process.wait()


async def _raw(address: str, request: bytes, source: str = "127.0.0.1") -> bytes:
    """Send raw bytes from `source`; the first line of the answer (b"" when closed)."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=(source, 0))
    try:
        writer.write(request)
        async with asyncio.timeout(10):
            return await reader.readline()
    except ConnectionError:  # closed while the rest was still being sent
        return b""
    finally:
        writer.close()


UPGRADE = (
    b"GET /link HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
)


def _binary_message(payload: bytes) -> bytes:
    """One masked websocket binary message, as a client sends it (whatever it unmasks to)."""
    return b"\x82\xff" + len(payload).to_bytes(8, "big") + b"\x01\x02\x03\x04" + payload


async def _refused_link(http: aiohttp.ClientSession, url: str, hello: str) -> str:
    """Why a link whose upgrade request carries `hello` is closed at once."""
    async with http.ws_connect(url, headers={HELLO_HEADER: hello}) as ws:
        closing = await ws.receive(timeout=10)
        assert closing.type is aiohttp.WSMsgType.CLOSE, closing
        assert closing.data == 1008
        return str(closing.extra)


async def test_bodies_over_a_routes_limit_are_refused_before_reading(target: Target) -> None:
    declared = b"POST /gossip HTTP/1.1\r\nHost: x\r\nContent-Length: 82837504\r\n\r\n" + bytes(1024)
    answers = await asyncio.gather(*(_raw(target.address, declared) for _ in range(8)))
    assert all(a.startswith(b"HTTP/1.1 413") for a in answers), answers
    api = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 82837504\r\n\r\n"
    assert (await _raw(target.address, api)).startswith(b"HTTP/1.1 401")  # token first

    async def chunks() -> object:  # no Content-Length: read up to the limit, then refused
        for _ in range(64):
            yield bytes(128 * 1024)

    async with aiohttp.ClientSession() as http:
        try:
            async with http.post(target.url("/gossip"), data=chunks()) as reply:
                assert reply.status == 413
        except aiohttp.ClientError:
            pass  # the node may close while the client still sends
    await target.still_serves()


async def test_a_strangers_first_frame_is_refused_unread(target: Target) -> None:
    """A link exists only once its hello authenticates: a megabyte behind an upgrade without
    one, or a megabyte of hello, is refused from the first few KiB."""
    before = attacker.rss(target.pid)
    no_hello = UPGRADE + b"\r\n" + _binary_message(bytes(MIB))
    big_hello = UPGRADE + HELLO_HEADER.encode() + b": " + b"A" * MIB + b"\r\n\r\n"
    sources = [f"127.0.1.{i}" for i in range(8)]  # under the per-address cap
    answers = await asyncio.gather(
        *(_raw(target.address, r, s) for s in sources for r in (no_hello, big_hello))
    )
    assert all(a.startswith(b"HTTP/1.1 101") for a in answers[::2]), answers  # then closed
    assert all(a == b"" or a.split()[1].startswith(b"4") for a in answers[1::2]), answers
    growth = attacker.rss(target.pid) - before
    assert growth < 4 * MIB, f"RSS grew by {growth / MIB:.1f} MiB over 16 MiB refused"
    await target.still_serves()


async def test_an_authenticated_links_frames_are_capped_at_the_models_largest(
    target: Target,
) -> None:
    links = FrameCodec(attacker.keys(target.secret).frame, NodeId("keyholder"))
    async with aiohttp.ClientSession() as http:
        async with http.get(target.url("/link")) as reply:
            a = NodeId(await reply.text())  # the id a hello is addressed to
        hello = {HELLO_HEADER: hello_header(links, a)}
        async with http.ws_connect(target.url("/link"), headers=hello, max_msg_size=0) as ws:
            assert (await ws.receive()).data == READY
            await ws.send_bytes(links.encode(CloseSession(SessionId("s")), a))  # taken
            await ws.send_bytes(bytes(target.link_frame_bytes + 1))
            closing = await ws.receive(timeout=10)
            assert closing.type is aiohttp.WSMsgType.CLOSE
            assert closing.data == aiohttp.WSCloseCode.MESSAGE_TOO_BIG, closing
        assert target.link_frame_bytes < 1 * MIB  # the tiny model's, not the wire's 72 MiB
    await target.still_serves()


async def test_connection_floods_meet_the_caps_not_the_open_file_limit(target: Target) -> None:
    one = attacker.open_sockets(target.address, "127.0.0.2", 100)
    assert await attacker.complete(target.address) == target.reference  # another address
    many = [
        s for i in range(3, 8) for s in attacker.open_sockets(target.address, f"127.0.0.{i}", 60)
    ]
    try:
        assert attacker.open_descriptors(target.pid) < attacker.NOFILE - 16
        admitted = sum(not attacker.closed_by_peer(s) for s in one)
        assert admitted <= attacker.CAPS["max_connections_per_address"]
        flood = one + many  # silent: closed once their headers are late
        await until(
            lambda: all(attacker.closed_by_peer(s) for s in flood),
            "the node closing every silent connection",
            15,
        )
    finally:
        attacker.close_all(one + many)
    await target.still_serves()


async def test_slow_senders_are_cut_off(target: Target) -> None:
    started = time.monotonic()

    async def dripping(request: bytes) -> bytes:
        host, _, port = target.address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for byte in request:
                writer.write(bytes([byte]))
                await asyncio.sleep(0.25)
                if reader.at_eof() or writer.is_closing():
                    break
            async with asyncio.timeout(10):
                return await reader.read(200)
        except ConnectionError:
            return b""
        finally:
            writer.close()

    headers = b"GET /status HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 40 + b"\r\n\r\n"
    body = b"POST /gossip HTTP/1.1\r\nHost: x\r\nContent-Length: 64\r\n\r\n"
    link = UPGRADE + HELLO_HEADER.encode() + b": " + b"A" * 40  # a hello that never ends
    answers = await asyncio.gather(
        dripping(link), dripping(headers), _raw(target.address, body + b"SW")
    )
    assert answers[0] == answers[1] == b""  # closed before the headers were complete
    assert answers[2].startswith(b"HTTP/1.1 408")
    assert time.monotonic() - started < 15
    await target.still_serves()


async def test_frames_replayed_elsewhere_or_from_the_past_are_refused(target: Target) -> None:
    """Node 0 refuses what was sealed for node 1 (a real other node), or for itself but
    long ago, or seen already; on gossip and on links alike."""
    keys = attacker.keys(target.secret)
    a = NodeId((await attacker.status(target.address))["node"]["id"])
    b = target.other_id  # node 1 may still be starting
    gossip = FrameCodec(keys.gossip, NodeId("mallory"))
    sealed = gossip.encode(CloseSession(SessionId("s")), a)  # passes every check but its type
    async with aiohttp.ClientSession() as http:

        async def post(frame: bytes) -> str:
            async with http.post(target.url("/gossip"), data=frame) as reply:
                assert reply.status == 400
                return await reply.text()

        # in two TCP segments, as a body may arrive: read whole, then past every check
        host, _, port = target.address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /gossip HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(sealed)
        )
        writer.write(sealed[:40])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(sealed[40:])
        answer = await reader.read(4096)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 400") and b"where a GossipFrame belongs" in answer
        assert "replay" in await post(sealed)
        elsewhere = gossip.encode(CloseSession(SessionId("s")), b)
        async with http.post(target.url("/gossip"), data=elsewhere) as reply:
            assert reply.status == 421 and "addressed to" in await reply.text()
        for days in (31 / 86400, 30):
            past = FrameCodec(keys.gossip, NodeId("m"), clock_ns=_ago(days))
            assert "outside the window" in await post(past.encode(CloseSession(SessionId("s")), a))
        links = FrameCodec(keys.frame, NodeId("mallory"))
        assert "addressed to" in await _refused_link(
            http, target.url("/link"), hello_header(links, b)
        )
        hello = hello_header(links, a)
        async with http.ws_connect(target.url("/link"), headers={HELLO_HEADER: hello}) as ws:
            assert (await ws.receive()).data == READY  # a key holder's hello opens a link
        # captured on its way, replayed
        assert "replay" in await _refused_link(http, target.url("/link"), hello)
        past_hello = hello_header(FrameCodec(keys.frame, NodeId("m"), clock_ns=_ago(1)), a)
        assert "outside the window" in await _refused_link(http, target.url("/link"), past_hello)
    await target.still_serves()


def _ago(days: float) -> Callable[[], int]:
    return lambda: time.time_ns() - int(days * 86400e9)


async def _answers(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as http, http.get(url) as reply:
            return reply.status in (200, 503)
    except aiohttp.ClientError:
        return False


MALFORMED = [
    b"GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n\r\n",
    b"GET /status HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 20000 + b"\r\n\r\n",
    b"GET /status HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),  # a TLS hello
    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
]


async def test_malformed_requests_are_4xx(target: Target) -> None:
    for request in MALFORMED:
        answer = await _raw(target.address, request)
        assert answer == b"" or answer.split()[1].startswith(b"4"), (request[:40], answer)
    auth = attacker.auth()
    bodies = [b'{"prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}", b"[" * 30_000]
    async with aiohttp.ClientSession() as http:
        for body in bodies:
            async with http.post(target.url("/v1/completions"), data=body, headers=auth) as r:
                assert r.status == 400
    await target.still_serves()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frame=st.binary(max_size=256), prefix=st.sampled_from([b"", b"SW\x02", b"SW\x01"]))
async def test_random_frames_are_refused_cleanly(
    target: Target, frame: bytes, prefix: bytes
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(target.url("/gossip"), data=prefix + frame) as reply:
            assert reply.status == 400
        hello = base64.b64encode(prefix + frame).decode()
        assert await _refused_link(http, target.url("/link"), hello)


async def test_refusals_are_counted_and_logged_at_most_once_per_peer(target: Target) -> None:
    refusals = (await attacker.status(target.address))["refusals"]
    reasons = ("body_too_large", "bad_frame", "header_timeout", "bad_hello", "headers_too_large")
    for reason in reasons:
        assert refusals.get(reason, 0) > 0, refusals
    caps = ("connections_per_address", "connections", "unfinished_headers")
    assert sum(refusals.get(reason, 0) for reason in caps) > 0, refusals
    async with (
        aiohttp.ClientSession() as http,
        http.get(target.url("/metrics"), headers=attacker.auth()) as reply,
    ):
        metrics = await reply.text()
    assert 'swarm_refusals_total{reason="bad_frame"}' in metrics
    port = target.address.rpartition(":")[2]
    log = (target.cluster.state_dir / f"node-{port}.log").read_text()
    lines = [line for line in log.splitlines() if "refused" in line]
    # one line per peer address and kind of refuser (connection, request, link, gossip) per
    # minute, whatever the number of refusals; the attacks came from 15 addresses
    assert len(lines) <= 4 * 15, lines
    assert sum(refusals.values()) > 3 * len(lines)
    await target.still_serves()


async def test_a_frame_captured_before_a_restart_is_refused(target: Target) -> None:
    """Node 1 started when the module began (the fixture), after this frame was sealed."""
    await until(lambda: _answers(target.url("/health", 1)), "node 1 answering", 120)
    async with (
        aiohttp.ClientSession() as http,
        http.post(target.url("/gossip", 1), data=target.captured) as reply,
    ):
        assert reply.status == 400
        refused = await reply.text()
    # a restart that takes longer than the clock window meets that check first
    assert "before this node started" in refused or "window" in refused, refused
    await target.still_serves()
