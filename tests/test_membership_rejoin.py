"""Healing (swarm.membership.rejoin): which addresses a node remembers, which it knocks on,
and when; and, on the simulated cluster, a partition that outlasts `dead_reclaim_s` merging
again once the network returns."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.factories import member
from harness.membership_sim import LOCAL, Cluster, addr
from swarm.membership.rejoin import Remembered, knock, missing, remember
from swarm.membership.updates import Dead, Left, Update
from swarm.membership.view import MembershipView
from swarm.types import MemberState

ME = addr("me")
A = member("a").node_id


def view_of(*names: str) -> MembershipView:
    return MembershipView.of([member(n) for n in ("me", *names)], 0.0)


def test_live_members_are_remembered_with_when_and_never_this_node() -> None:
    remembered = remember(Remembered(), view_of("a", "b"), ME, 5.0, LOCAL)
    assert remembered.seen == ((addr("a"), 5.0), (addr("b"), 5.0))


@pytest.mark.parametrize(
    ("why", "gone", "kept"),
    [
        (
            "a dead member is still worth knocking on",
            Dead(A, 0, member("me").node_id),
            True,
        ),
        ("a member that left gracefully is not", Left(A, 0), False),
    ],
)
def test_gone_members(why: str, gone: Update, kept: bool) -> None:
    view = view_of("a")
    remembered = remember(Remembered(), view, ME, 1.0, LOCAL)
    view, _ = view.apply(gone, 2.0)
    remembered = remember(remembered, view, ME, 2.0, LOCAL)
    assert (addr("a") in remembered.addresses) is kept, why


def test_an_address_not_seen_alive_for_remember_for_s_is_forgotten() -> None:
    remembered = Remembered(((addr("a"), 0.0),))
    assert remember(remembered, view_of(), ME, LOCAL.remember_for_s, LOCAL).addresses == (
        addr("a"),
    )
    assert remember(remembered, view_of(), ME, LOCAL.remember_for_s + 1, LOCAL).addresses == ()


def test_missing_is_the_remembered_and_seeds_without_a_live_member() -> None:
    remembered = Remembered(((addr("a"), 0.0), (addr("gone"), 0.0)))
    absent = missing(remembered, view_of("a"), [addr("seed"), ME], ME)
    assert absent == sorted([addr("gone"), addr("seed")])


def test_knocks_back_off_and_take_turns_over_the_absent() -> None:
    cfg = replace(LOCAL, rejoin_interval_s=1.0, rejoin_max_interval_s=4.0, rejoin_fanout=2)
    absent = ["a", "b", "c"]
    state, now, knocked = Remembered(), 0.0, []
    while now < 20.0:
        state, targets = knock(state, absent, now, cfg)
        if targets:
            knocked.append((now, targets))
        now += 0.5
    times = [t for t, _ in knocked]
    assert times[:5] == [0.0, 1.0, 3.0, 7.0, 11.0]  # waits of 1, 2, 4, then capped at 4
    assert [t for _, t in knocked[:3]] == [("a", "b"), ("c", "a"), ("b", "c")]


def test_nothing_absent_resets_the_back_off_to_one_interval() -> None:
    state = Remembered((), next_at=100.0, attempt=6)
    state, targets = knock(state, [], 50.0, LOCAL)
    assert targets == () and state.attempt == 0
    assert state.next_at == 50.0 + LOCAL.rejoin_interval_s


def test_a_partition_longer_than_dead_reclaim_heals() -> None:
    """Each side declares the other dead and then forgets it (past dead_reclaim_s): no full
    sync is left to heal them. Knocking on remembered addresses merges them again within a
    knock's wait and a gossip round once the network returns."""
    names = [f"m{i}" for i in range(5)]
    cluster = Cluster([member(n) for n in names])
    cluster.run_until(1.0)
    cluster.sides = [{addr(n) for n in names[:3]}]
    held = 1.0 + 4 * LOCAL.dead_reclaim_s
    cluster.run_until(held)
    assert all(None in cluster.states_of(n) for n in names), "each side forgot the other"
    cluster.sides = []
    cluster.run_until(held + LOCAL.rejoin_max_interval_s + 2.0)
    assert all(cluster.states_of(n) == {MemberState.ALIVE} for n in names)
