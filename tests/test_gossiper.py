"""The gossiper's own bookkeeping, apart from the protocol it drives."""

from __future__ import annotations

from pathlib import Path
from random import Random

import pytest

from harness.factories import member
from swarm.config import MembershipConfig
from swarm.membership import protocol
from swarm.membership.address_book import AddressBook
from swarm.membership.gossip import Gossiper
from swarm.types import NodeId
from swarm.wire import FrameCodec, SwarmKeys, generate_secret


def test_unreachable_keeps_only_addresses_the_view_lists() -> None:
    me = member("me")
    keys = SwarmKeys.derive(generate_secret())
    gossiper = Gossiper(MembershipConfig(), me, FrameCodec(keys.frame, NodeId("me")))
    gossiper.unreachable.update({me.address: 1.0, "gone:7070": 2.0})
    gossiper._forget_unlisted()
    assert gossiper.unreachable == {me.address: 1.0}


def test_the_address_book_keeps_what_it_is_given(tmp_path: Path) -> None:
    book = AddressBook(tmp_path / "state" / "members-7420.json")
    assert book.load() == []  # no file yet: nothing remembered
    book.save([("a:1", 100.0), ("b:2", 200.0)])
    assert sorted(book.load()) == [("a:1", 100.0), ("b:2", 200.0)]


@pytest.mark.parametrize(
    "text", ["", "{", "[]", '{"seen": 3}', '{"seen": {"a:1": "soon"}}', '{"other": {}}']
)
def test_an_unreadable_address_book_is_one_warning_and_empty(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "members-7420.json"
    path.write_text(text)
    assert AddressBook(path).load() == []
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1


def test_a_remembered_address_of_this_node_is_ignored() -> None:
    me = member("me")
    state = protocol.start(MembershipConfig(), me, 0.0, Random(0))
    step = protocol.join(state, [], [(me.address, 0.0), ("b:7070", 0.0)])
    assert step.node.remembered.addresses == ("b:7070",)
