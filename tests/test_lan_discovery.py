"""LAN discovery's pure parts: the swarm's fingerprint, what a node makes of each announcement
it hears (a table), and a member found there joined as a bootstrap address is. The mDNS side
runs in tests/test_lan_discovery_e2e.py."""

from __future__ import annotations

from random import Random

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from harness.factories import member
from harness.membership_sim import LOCAL, addr
from swarm.membership import protocol
from swarm.membership.messages import PushPull
from swarm.net.discovery import (
    Announcement,
    Member,
    Stranger,
    Unreadable,
    announcement,
    fingerprint,
    instance_name,
    read_announcement,
)
from swarm.types import NodeId
from swarm.wire import SwarmKeys, generate_secret

SECRET = bytes(range(32))
OURS = fingerprint(SwarmKeys.derive(SECRET))
ME = NodeId("me0000000000")


def test_the_fingerprint_is_an_hkdf_output_under_its_own_label() -> None:
    keys = SwarmKeys.derive(SECRET)
    expected = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=b"swarm/wire/v1", info=b"swarm discovery"
    ).derive(SECRET)
    assert expected[:16].hex() == OURS and len(OURS) == 32
    assert fingerprint(SwarmKeys.derive(SECRET)) == OURS  # the same secret, the same swarm
    assert fingerprint(SwarmKeys.derive(generate_secret())) != OURS
    for key in (SECRET, keys.frame, keys.gossip, keys.invite):  # nothing else is in it
        assert key.hex()[:8] not in OURS and OURS[:8] not in key.hex()
    assert OURS not in repr(keys)


def _fields(**text: str | None) -> dict[bytes, bytes | None]:
    return {k.encode(): None if v is None else v.encode() for k, v in text.items()}


def _ours(**changes: str | None) -> dict[bytes, bytes | None]:
    fields: dict[str, str | None] = {
        **announcement(OURS, NodeId("b00000000000"), "10.0.0.2:7420"),
        **changes,
    }
    return _fields(**fields)


@pytest.mark.parametrize(
    ("fields", "read"),
    [
        (_ours(), Member(NodeId("b00000000000"), "10.0.0.2:7420")),
        (_ours(address="[fd00::2]:7421"), Member(NodeId("b00000000000"), "[fd00::2]:7421")),
        (_ours(address="nas.local:7420"), Member(NodeId("b00000000000"), "nas.local:7420")),
        (_ours(id=ME), None),  # this node's own announcement
        (_ours(swarm="0" * 32), Stranger("0" * 32)),
        (_ours(swarm="0" * 32, id=ME), Stranger("0" * 32)),
        (_ours(v="2"), Unreadable("version '2', not '1'")),
        (_ours(v=None), Unreadable("version None, not '1'")),
        (_fields(v="1", id="b"), Unreadable("no swarm, address")),
        (_ours(address=""), Unreadable("no address")),
        (
            _ours(address="10.0.0.2"),
            Unreadable(
                "address '10.0.0.2': '10.0.0.2' is not host:port (an IPv6 address goes in brackets)"
            ),
        ),
        (
            _ours(address="10.0.0.2:0"),
            Unreadable(
                "address '10.0.0.2:0': '10.0.0.2:0' is not "
                "host:port (an IPv6 address goes in brackets)"
            ),
        ),
        ({**_ours(), b"id": b"\xff\xfe"}, Unreadable("field b'id' is not text")),
        ({**_ours(), b"note": b"x" * 300}, Member(NodeId("b00000000000"), "10.0.0.2:7420")),
    ],
)
def test_what_an_announcement_says(
    fields: dict[bytes, bytes | None], read: Announcement | None
) -> None:
    assert read_announcement(fields, OURS, ME) == read


def test_a_node_announces_itself_under_its_own_name() -> None:
    assert instance_name(ME) == "swarm-me0000000000._swarm._tcp.local."
    fields = _fields(**announcement(OURS, ME, "10.0.0.1:7420"))
    assert read_announcement(fields, OURS, ME) is None


def test_a_member_found_on_the_lan_is_joined_and_asked_again_while_alone() -> None:
    joiner = protocol.start(LOCAL, member("z"), 0.0, Random(0))
    step = protocol.join(joiner, [])
    assert step.sends == ()
    found = protocol.discovered(step.node, addr("a"))
    assert [
        (s.address, s.message.join) for s in found.sends if isinstance(s.message, PushPull)
    ] == [(addr("a"), True)]
    assert protocol.discovered(found.node, addr("a")).sends == ()  # once
    assert protocol.discovered(found.node, addr("z")).sends == ()  # never itself
    again = protocol.poll(found.node, found.node.next_probe_at, Random(0))
    assert [s.address for s in again.sends if isinstance(s.message, PushPull)] == [addr("a")]
