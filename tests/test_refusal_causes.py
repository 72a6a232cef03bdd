"""Why a node refuses a frame, counted by cause and by peer: another key, a clock outside the
window, another protocol version, a replay, a frame for another node. `swarm doctor` reads
these from /status, and probes a node's gossip path with a frame that changes nothing."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web

from harness.factories import member
from swarm.config import MembershipConfig, load_config
from swarm.errors import FrameError
from swarm.logs import Refusals
from swarm.membership.gossip import GOSSIP_PATH, REFUSAL_HEADER, Gossiper, seal_key_probe
from swarm.types import NodeId
from swarm.wire import FrameCodec, LinkHello, SwarmKeys, generate_secret, shifted_clock_ns

KEYS = SwarmKeys.derive(generate_secret())
OTHER = SwarmKeys.derive(generate_secret())
ME = NodeId("me")
MINUTE_NS = 60 * 10**9


def _sealed(
    key: bytes = KEYS.frame,
    receiver: str = "me",
    clock_ns: Callable[[], int] = time.time_ns,
) -> bytes:
    return FrameCodec(key, NodeId("peer"), clock_ns=clock_ns).encode(LinkHello(), NodeId(receiver))


def _other_version(frame: bytes) -> bytes:
    return frame[:2] + bytes([frame[2] + 1]) + frame[3:]


@pytest.mark.parametrize(
    ("frame", "refusal"),
    [
        (lambda: _sealed(OTHER.frame), "wrong_key"),
        (lambda: _sealed(clock_ns=lambda: time.time_ns() + MINUTE_NS), "clock"),
        (lambda: _sealed(clock_ns=lambda: time.time_ns() - MINUTE_NS), "clock"),
        (lambda: _other_version(_sealed()), "version"),
        (lambda: _sealed(receiver="someone-else"), "misaddressed"),
        (lambda: b"SW\x02" + bytes(60), "bad_frame"),
    ],
)
def test_each_cause_is_its_own_refusal(frame: Callable[[], bytes], refusal: str) -> None:
    with pytest.raises(FrameError) as refused:
        FrameCodec(KEYS.frame, ME).decode(frame())
    assert refused.value.refusal == refusal


def test_a_frame_seen_twice_is_a_replay() -> None:
    codec, frame = FrameCodec(KEYS.frame, ME), _sealed()
    codec.decode(frame)
    with pytest.raises(FrameError) as refused:
        codec.decode(frame)
    assert refused.value.refusal == "replay"


def test_a_hello_refused_for_its_cause_counts_as_the_cause() -> None:
    with pytest.raises(FrameError) as wrong:
        FrameCodec(KEYS.frame, ME).decode(_sealed(OTHER.frame), expect=LinkHello)
    assert wrong.value.counted_as("bad_hello") == "wrong_key"
    assert FrameError("garbled").counted_as("bad_hello") == "bad_hello"


def test_refusals_are_kept_per_peer_and_reason_most_recent_first() -> None:
    now = [0.0]
    refusals = Refusals(logging.getLogger("test"), "gossip", clock=lambda: now[0])
    for peer, reason in [
        ("10.0.0.2", "wrong_key"),
        ("10.0.0.3", "clock"),
        ("10.0.0.2", "wrong_key"),
    ]:
        now[0] += 1.0
        refusals.refuse(reason, peer, "why")
    rows = [(p.peer, p.reason, p.count, p.last, p.what) for p in refusals.by_peer()]
    assert rows == [
        ("10.0.0.2", "wrong_key", 2, 3.0, "gossip"),
        ("10.0.0.3", "clock", 1, 2.0, "gossip"),
    ]
    for i in range(100):  # a stranger's many addresses: only the most recent pairs are kept
        refusals.refuse("bad_frame", f"10.1.0.{i}", "why")
    assert len(refusals.by_peer()) == 64
    assert refusals.counts == {"wrong_key": 2, "clock": 1, "bad_frame": 100}


def test_the_test_clock_offset_shifts_the_frames_clock_only_when_set() -> None:
    assert shifted_clock_ns(0.0) is time.time_ns
    ahead = shifted_clock_ns(90.0)() - time.time_ns()
    assert 89 * 10**9 < ahead < 91 * 10**9
    config = load_config(environ={"SWARM_NET_TEST_CLOCK_OFFSET_S": "-120"})
    assert config.net.test_clock_offset_s == -120.0
    assert load_config(environ={}).net.test_clock_offset_s == 0.0


@pytest.fixture
async def gossip_node() -> AsyncIterator[tuple[str, Gossiper]]:
    codec = FrameCodec(KEYS.gossip, ME, accept_unaddressed=True)
    gossiper = Gossiper(MembershipConfig(), member("me"), codec)
    app = web.Application()
    app.router.add_post(GOSSIP_PATH, gossiper.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}{GOSSIP_PATH}", gossiper
    finally:
        await runner.cleanup()


async def _post(url: str, frame: bytes) -> tuple[int, str | None]:
    async with aiohttp.ClientSession() as http, http.post(url, data=frame) as reply:
        return reply.status, reply.headers.get(REFUSAL_HEADER)


async def test_a_key_probe_opens_and_changes_nothing(gossip_node: tuple[str, Gossiper]) -> None:
    url, gossiper = gossip_node
    probe = FrameCodec(KEYS.gossip, NodeId("doctor-1"), accept_unaddressed=True)
    assert await _post(url, seal_key_probe(probe, ME)) == (204, None)
    assert gossiper.heard_s_ago(NodeId("doctor-1")) is None
    assert not gossiper.unreachable and len(gossiper.view) == 1


@pytest.mark.parametrize(
    ("codec", "refusal"),
    [
        (FrameCodec(OTHER.gossip, NodeId("doctor-2")), "wrong_key"),
        (FrameCodec(KEYS.gossip, NodeId("doctor-3"), clock_ns=shifted_clock_ns(-45.0)), "clock"),
    ],
)
async def test_a_refused_probe_says_why_and_names_the_peer(
    gossip_node: tuple[str, Gossiper], codec: FrameCodec, refusal: str
) -> None:
    url, gossiper = gossip_node
    assert await _post(url, seal_key_probe(codec, ME)) == (400, refusal)
    [refused] = gossiper.refusals.by_peer()
    assert (refused.peer, refused.reason, refused.count) == ("127.0.0.1", refusal, 1)
