"""The member table's rules, one table row each."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.factories import MODEL, member
from harness.membership_sim import view_of
from swarm.config import Config, MembershipConfig
from swarm.membership.updates import Alive, Dead, Left, Suspect, Update
from swarm.membership.view import MembershipView, refute
from swarm.model_routing import members_of
from swarm.types import MemberRecord, MemberState, ModelId, NodeId

MODEL_A = MODEL  # the model of a member record that names none
MODEL_B = ModelId("b" * 64)
LAN = Config.lan().membership
ME = NodeId("me")


def nid(name: str) -> NodeId:
    return NodeId(name)


A = nid("n1")
ALIVE, SUSPECT, DEAD, LEFT = MemberState


def al(incarnation: int) -> Alive:
    return Alive(member("n1", incarnation=incarnation))


def su(incarnation: int, by: NodeId = ME) -> Suspect:
    return Suspect(A, incarnation, by)


def de(incarnation: int) -> Dead:
    return Dead(A, incarnation, ME)


def le(incarnation: int) -> Left:
    return Left(A, incarnation)


RULES: list[tuple[str, tuple[Update, ...], Update, MemberState, int, bool]] = [
    # name, history, update, expected state, expected incarnation, changed
    ("unknown node joins", (), al(0), ALIVE, 0, True),
    ("higher alive wins", (al(0),), al(1), ALIVE, 1, True),
    ("stale alive ignored", (al(2),), al(1), ALIVE, 2, False),
    ("duplicate alive ignored", (al(0),), al(0), ALIVE, 0, False),
    ("suspect overrides alive at same incarnation", (al(1),), su(1), SUSPECT, 1, True),
    ("suspect at higher incarnation overrides alive", (al(1),), su(3), SUSPECT, 3, True),
    ("stale suspect ignored", (al(2),), su(1), ALIVE, 2, False),
    ("second suspicion from elsewhere ignored", (al(0), su(0)), su(0, nid("x")), SUSPECT, 0, False),
    ("alive at same incarnation does not clear suspect", (al(0), su(0)), al(0), SUSPECT, 0, False),
    ("refutation: alive at i+1 clears suspect at i", (al(0), su(0)), al(1), ALIVE, 1, True),
    ("dead overrides suspect", (al(0), su(0)), de(0), DEAD, 0, True),
    ("dead overrides alive at same incarnation", (al(0),), de(0), DEAD, 0, True),
    ("dead is final: alive at same incarnation", (al(0), de(0)), al(0), DEAD, 0, False),
    ("dead is final: suspect at same incarnation", (al(0), de(0)), su(0), DEAD, 0, False),
    ("dead refuted by a higher incarnation", (al(0), de(0)), al(1), ALIVE, 1, True),
    ("left overrides alive", (al(0),), le(0), LEFT, 0, True),
    ("left is final: alive at same incarnation", (al(0), le(0)), al(0), LEFT, 0, False),
    ("left is final: dead at same incarnation", (al(0), le(0)), de(0), LEFT, 0, False),
    ("left overrides dead at same incarnation", (al(0), de(0)), le(0), LEFT, 0, True),
    ("rejoin after leave at a higher incarnation", (al(0), le(0)), al(1), ALIVE, 1, True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("history", "update", "state", "incarnation", "changed"),
    [row[1:] for row in RULES],
    ids=[row[0] for row in RULES],
)
def test_rule(
    history: tuple[Update, ...],
    update: Update,
    state: MemberState,
    incarnation: int,
    changed: bool,
) -> None:
    before = view_of(*history)
    after, did = before.apply(update, now=1.0)
    entry = after.get(A)
    assert entry is not None
    assert (entry.state, entry.incarnation, did) == (state, incarnation, changed)
    if not changed:
        assert after is before


def test_suspicion_before_record_is_kept_but_not_listed() -> None:
    view = view_of(Suspect(A, 2, ME))
    assert view.state_of(A) is None
    assert view.live_members() == ()
    view, changed = view.apply(Alive(member("n1", incarnation=1)), 0.0)
    assert changed
    entry = view.get(A)
    assert entry is not None and entry.state is MemberState.SUSPECT and entry.incarnation == 2
    assert view.live_members() == (member("n1", incarnation=1),)


def test_record_keeps_newest_contents_under_a_suspicion() -> None:
    view = view_of(Alive(member("n1")), Suspect(A, 5, ME), Alive(member("n1", incarnation=3)))
    entry = view.get(A)
    assert entry is not None and entry.record is not None
    assert (entry.state, entry.incarnation, entry.record.incarnation) == (MemberState.SUSPECT, 5, 3)


# ---- time --------------------------------------------------------------------------------


def test_suspect_becomes_dead_after_the_suspicion_timeout() -> None:
    view = view_of(Alive(member("n1")), Alive(member("n2")), now=0.0)
    view, _ = view.apply(Suspect(A, 0, nid("n2")), now=10.0)
    timeout = LAN.suspicion_timeout_s(2)
    assert view.next_deadline(LAN) == pytest.approx(10.0 + timeout)
    early, declared = view.tick(10.0 + timeout - 0.01, LAN, ME)
    assert early is view and declared == ()
    late, declared = view.tick(10.0 + timeout, LAN, ME)
    assert declared == (Dead(A, 0, ME),)
    assert late.state_of(A) is MemberState.DEAD
    assert late.live_ids == (nid("n2"),)


@pytest.mark.parametrize("gone", [Dead(A, 0, ME), Left(A, 0)], ids=["dead", "left"])
def test_dead_and_left_are_reclaimed(gone: Update) -> None:
    view = view_of(Alive(member("n1")), gone, now=5.0)
    kept, _ = view.tick(5.0 + LAN.dead_reclaim_s - 0.01, LAN, ME)
    assert A in kept
    gone_view, declared = view.tick(5.0 + LAN.dead_reclaim_s, LAN, ME)
    assert A not in gone_view and declared == ()


def test_tick_is_a_no_op_when_everyone_is_alive() -> None:
    view = view_of(Alive(member("n1")), Alive(member("n2")))
    assert view.tick(1e9, LAN, ME) == (view, ())
    assert view.next_deadline(LAN) is None


def test_suspicion_timeout_grows_with_members() -> None:
    config = MembershipConfig()
    assert config.suspicion_timeout_s(1000) > config.suspicion_timeout_s(10)


# ---- queries -----------------------------------------------------------------------------


def names(records: tuple[MemberRecord, ...]) -> list[str]:
    return [r.node_id for r in records]


def test_routable_members_share_the_model_and_are_alive() -> None:
    view = view_of(
        Alive(member("n1")),
        Alive(member("n2", model_id=MODEL_B)),
        Alive(member("n3")),
        Suspect(nid("n3"), 0, ME),
        Alive(member("n4")),
        Dead(nid("n4"), 0, ME),
    )
    assert names(view.alive_members()) == ["n1", "n2"]
    assert names(view.live_members()) == ["n1", "n2", "n3"]
    assert names(members_of(view.alive_members(), MODEL_A)) == ["n1"]
    assert names(members_of(view.alive_members(), MODEL_B)) == ["n2"]
    assert view.live_ids == ("n1", "n2", "n3")


def test_full_state_round_trip_softens_dead_to_suspect() -> None:
    source = view_of(
        Alive(member("n1")),
        Alive(member("n2", incarnation=2)),
        Suspect(nid("n2"), 2, ME),
        Alive(member("n3")),
        Dead(nid("n3"), 0, ME),
        Alive(member("n4")),
        Left(nid("n4"), 0),
    )
    merged, changes = MembershipView.empty().merge_full_state(source.full_state(ME), 0.0)
    states = {e.node_id: e.state for e in merged}
    assert states == {
        "n1": MemberState.ALIVE,
        "n2": MemberState.SUSPECT,
        "n3": MemberState.SUSPECT,
        "n4": MemberState.LEFT,
    }
    assert len(changes) == 7
    exact, _ = MembershipView.empty().apply_all(source.full_state(ME), 0.0)
    assert exact == source


# ---- refutation --------------------------------------------------------------------------

LOCAL = member("me", incarnation=3)
REFUTE: list[tuple[str, Update, bool, int | None]] = [
    # name, update about the local node, leaving, refuted incarnation (None: no refutation)
    ("suspicion at own incarnation", Suspect(ME, 3, A), False, 4),
    ("suspicion at a higher incarnation", Suspect(ME, 7, A), False, 8),
    ("stale suspicion", Suspect(ME, 2, A), False, None),
    ("death", Dead(ME, 3, A), False, 4),
    ("a leave it did not announce", Left(ME, 3), False, 4),
    ("its own leave", Left(ME, 3), True, None),
    ("suspicion while leaving", Suspect(ME, 3, A), True, None),
    ("its own record", Alive(LOCAL), False, None),
    ("an older record", Alive(replace(LOCAL, incarnation=1)), False, None),
    ("another record at its incarnation", Alive(replace(LOCAL, address="elsewhere:1")), False, 4),
    ("a record from a previous life", Alive(replace(LOCAL, incarnation=9)), False, 10),
    ("news about another node", Suspect(A, 3, ME), False, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("update", "leaving", "incarnation"),
    [row[1:] for row in REFUTE],
    ids=[row[0] for row in REFUTE],
)
def test_refute(update: Update, leaving: bool, incarnation: int | None) -> None:
    refuted = refute(LOCAL, update, leaving)
    if incarnation is None:
        assert refuted is None
    else:
        assert refuted == replace(LOCAL, incarnation=incarnation)
        view, _ = view_of(Alive(LOCAL), update).apply(Alive(refuted), 1.0)
        assert view.state_of(ME) is MemberState.ALIVE


def test_two_records_at_one_incarnation_merge_the_same_either_way() -> None:
    """A restart that lost its incarnation: both orders agree, and the owner refutes."""
    first, second = Alive(member("n1", address="n1:7070")), Alive(member("n1", address="n1:7071"))
    assert view_of(first, second) == view_of(second, first)
