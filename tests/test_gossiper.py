"""The gossiper's own bookkeeping, apart from the protocol it drives."""

from __future__ import annotations

from swarm.config import MembershipConfig
from swarm.membership.gossip import Gossiper
from swarm.types import NodeId
from swarm.wire import FrameCodec, SwarmKeys, generate_secret
from tests.test_membership_view import record


def test_unreachable_keeps_only_addresses_the_view_lists() -> None:
    me = record("me")
    keys = SwarmKeys.derive(generate_secret())
    gossiper = Gossiper(MembershipConfig(), me, FrameCodec(keys.frame, NodeId("me")))
    gossiper.unreachable.update({me.address: 1.0, "gone:7070": 2.0})
    gossiper._forget_unlisted()
    assert gossiper.unreachable == {me.address: 1.0}
