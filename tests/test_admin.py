"""The admin endpoint over a real HTTP server: a frame sealed with the swarm key changes the
node's slowdown and its member record; anything else is refused and changes nothing."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from swarm.admin import SLOWDOWN_PATH, Admin, Pace
from swarm.client import SwarmClient
from swarm.config import Config
from swarm.errors import FrameError
from swarm.membership.gossip import Gossiper
from swarm.types import NodeId
from swarm.wire import FrameCodec, SetSlowdown, SwarmKeys, generate_secret
from tests.test_membership_view import record


@pytest.fixture
async def node() -> tuple[str, Pace, Gossiper]:  # type: ignore[misc]
    keys = SwarmKeys.loopback()
    pace = Pace(1.0)
    gossiper = Gossiper(Config.local().membership, record("a"), FrameCodec(keys.gossip, "a"))
    app = web.Application()
    app.router.add_post(SLOWDOWN_PATH, Admin(FrameCodec(keys.frame, "a"), pace, gossiper).handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"127.0.0.1:{port}", pace, gossiper
    await runner.cleanup()


async def test_a_sealed_frame_changes_the_slowdown_and_the_record(node) -> None:  # type: ignore[no-untyped-def]
    address, pace, gossiper = node
    assert await SwarmClient(address).set_slowdown(3.0, None) == 3.0
    assert pace.slowdown == 3.0 and gossiper.local.slowdown == 3.0


async def test_anything_else_is_refused_and_changes_nothing(node) -> None:  # type: ignore[no-untyped-def]
    address, pace, gossiper = node
    wrong_key = SwarmKeys.derive(generate_secret()).frame
    right_key = SwarmKeys.loopback().frame
    sealed = FrameCodec(right_key, NodeId("admin")).encode(SetSlowdown(2.0))
    bodies = [
        FrameCodec(wrong_key, NodeId("admin")).encode(SetSlowdown(2.0)),  # another swarm
        b"not a frame",
        b"\x00" * 5000,  # too big
        sealed,
        sealed,  # the same frame again: a replay
    ]
    statuses = []
    async with aiohttp.ClientSession() as http:
        for body in bodies:
            async with http.post(f"http://{address}{SLOWDOWN_PATH}", data=body) as r:
                statuses.append(r.status)
    assert statuses == [400, 400, 400, 200, 400]
    assert pace.slowdown == 2.0 and gossiper.local.slowdown == 2.0  # only the sealed one


def test_a_slowdown_out_of_range_does_not_decode() -> None:
    codec = FrameCodec(SwarmKeys.loopback().frame, NodeId("admin"))
    frame = codec.encode(SetSlowdown(0.5))
    with pytest.raises(FrameError, match="slowdown"):
        FrameCodec(SwarmKeys.loopback().frame, NodeId("b")).decode(frame)
