"""Properties of the member table that must hold for any sequence of gossip updates."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.factories import member
from harness.membership_sim import view_of
from swarm.config import Config
from swarm.membership.broadcast import BroadcastQueue, estimated_size, retransmit_limit
from swarm.membership.updates import STATE_RANK, Alive, Dead, Left, Suspect, Update
from swarm.membership.view import MembershipView, refute
from swarm.types import MemberState, NodeId

LAN = Config.lan().membership
FEW = settings(deadline=None, max_examples=150)
NAMES = ["n1", "n2", "n3"]
node_ids = st.sampled_from([NodeId(n) for n in NAMES])
incarnations = st.integers(0, 2)

alive = st.builds(
    lambda name, inc, port: Alive(member(name, incarnation=inc, address=f"{name}:{port}")),
    st.sampled_from(NAMES),
    incarnations,
    st.sampled_from([7070, 7071]),  # two contents at one incarnation: a restarted node
)
updates: st.SearchStrategy[Update] = st.one_of(
    alive,
    st.builds(Suspect, node_ids, incarnations, node_ids),
    st.builds(Dead, node_ids, incarnations, node_ids),
    st.builds(Left, node_ids, incarnations),
)
update_lists = st.lists(updates, max_size=14)


@FEW
@given(update_lists.flatmap(lambda us: st.tuples(st.just(us), st.permutations(us))))
def test_merge_is_commutative(pair: tuple[list[Update], list[Update]]) -> None:
    original, shuffled = pair
    assert view_of(*original) == view_of(*shuffled)


@FEW
@given(update_lists)
def test_merge_is_idempotent(us: list[Update]) -> None:
    view = view_of(*us)
    assert view_of(*us, *us) == view
    for u in us:
        again, changed = view.apply(u, now=5.0)
        assert not changed and again is view


@FEW
@given(update_lists, update_lists, update_lists)
def test_merging_views_is_associative(a: list[Update], b: list[Update], c: list[Update]) -> None:
    """Push-pull joins whole views; grouping must not matter."""
    va, vb, vc = view_of(*a), view_of(*b), view_of(*c)

    def join(x: MembershipView, y: MembershipView) -> MembershipView:
        return x.apply_all(y.full_state(NodeId("me")), 0.0)[0]

    assert join(join(va, vb), vc) == join(va, join(vb, vc)) == view_of(*a, *b, *c)


@FEW
@given(update_lists)
def test_incarnation_never_decreases(us: list[Update]) -> None:
    view = MembershipView.empty()
    for u in us:
        before = view.get(u.node_id)
        view, _ = view.apply(u, 0.0)
        after = view.get(u.node_id)
        assert after is not None
        if before is not None:
            assert after.incarnation >= before.incarnation
            assert after.key >= before.key
            if before.record is not None:
                assert after.record is not None
                assert after.record.incarnation >= before.record.incarnation


@FEW
@given(update_lists)
def test_dead_and_left_are_final_for_their_incarnation(us: list[Update]) -> None:
    view = MembershipView.empty()
    final: dict[NodeId, tuple[int, MemberState]] = {}
    for u in us:
        view, _ = view.apply(u, 0.0)
        for entry in view:
            if entry.node_id in final:
                incarnation, state = final[entry.node_id]
                if entry.incarnation == incarnation:
                    assert STATE_RANK[entry.state] >= STATE_RANK[state]
            if entry.state in (MemberState.DEAD, MemberState.LEFT):
                final[entry.node_id] = (entry.incarnation, entry.state)


@FEW
@given(update_lists, st.floats(0, 200))
def test_tick_only_moves_suspects_to_dead_and_forgets_the_gone(
    us: list[Update], later: float
) -> None:
    view = view_of(*us, now=0.0)
    ticked, declared = view.tick(later, LAN, NodeId("me"))
    for entry in view:
        after = ticked.get(entry.node_id)
        if after is None:
            assert entry.state in (MemberState.DEAD, MemberState.LEFT)
            assert later >= LAN.dead_reclaim_s
            continue
        assert after.incarnation == entry.incarnation and after.record == entry.record
        if after.state is not entry.state:
            assert (entry.state, after.state) == (MemberState.SUSPECT, MemberState.DEAD)
    assert {d.node_id for d in declared} == {
        e.node_id
        for e in view
        if e.state is MemberState.SUSPECT
        and e.record is not None
        and ticked.state_of(e.node_id) is MemberState.DEAD
    }


@FEW
@given(updates)
def test_a_refutation_overrides_what_it_answers(about: Update) -> None:
    local = member("n1", incarnation=1)
    refuted = refute(local, about)
    if about.node_id != local.node_id:
        assert refuted is None
        return
    view = view_of(Alive(local), about)
    if refuted is None:
        # Nothing to answer: the update was stale or was our own record.
        assert view.state_of(local.node_id) is MemberState.ALIVE
        return
    assert refuted.incarnation > max(local.incarnation, about.incarnation)
    final, changed = view.apply(Alive(refuted), 1.0)
    entry = final.get(local.node_id)
    assert changed and entry is not None
    assert (entry.state, entry.record) == (MemberState.ALIVE, refuted)


@FEW
@given(st.lists(updates, max_size=30), st.integers(1, 600), st.integers(1, 8))
def test_broadcast_queue_sends_each_update_a_bounded_number_of_times(
    us: list[Update], members: int, per_message: int
) -> None:
    queue = BroadcastQueue()
    for u in us:
        queue = queue.push(u)
    latest = {u.node_id: u for u in us}  # a newer update about a member replaces the older
    sent: Counter[Update] = Counter()
    budget = 4 * 64 + 320
    while len(queue):
        queue, batch = queue.take(members, 4, per_message, budget)
        assert batch, "a non-empty queue must make progress"
        assert len(batch) <= per_message
        assert sum(estimated_size(u) for u in batch) <= budget
        sent.update(batch)
    limit = retransmit_limit(4, members)
    assert set(sent) == set(latest.values())
    assert all(count == limit for count in sent.values())
