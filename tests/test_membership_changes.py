"""What the rebalancer asks of Membership's façade instead of reaching into its gossiper:
publishing its record, and hearing of changes to the view."""

from __future__ import annotations

import asyncio
import dataclasses

from harness.factories import member
from swarm.config import MembershipConfig
from swarm.membership.gossip import Gossiper
from swarm.membership.subsystem import Membership
from swarm.types import LayerSpan, NodeId
from swarm.wire import FrameCodec, SwarmKeys, generate_secret

QUIET_S = 0.02  # seconds without a change that count as quiet here


def _membership() -> Membership:
    keys = SwarmKeys.derive(generate_secret())
    gossiper = Gossiper(MembershipConfig(), member("me"), FrameCodec(keys.frame, NodeId("me")))
    return Membership(gossiper, None, ())  # type: ignore[arg-type]  # no probes run here


async def test_a_published_record_is_the_local_one_and_a_change_heard_once() -> None:
    membership = _membership()
    membership.publish(dataclasses.replace(membership.local, span=LayerSpan(0, 2)))
    assert membership.local.span == LayerSpan(0, 2)
    assert membership.local.incarnation > member("me").incarnation
    # a change before the wait counts, unless the wait is fresh
    assert await membership.changed_within(QUIET_S)
    assert not await membership.changed_within(QUIET_S, fresh=True)


async def test_quiet_returns_once_no_change_came_for_its_time() -> None:
    membership = _membership()
    membership.publish(dataclasses.replace(membership.local, span=LayerSpan(0, 2)))
    await asyncio.wait_for(membership.quiet(QUIET_S), timeout=5.0)
    assert not await membership.changed_within(QUIET_S)
