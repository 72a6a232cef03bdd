"""The rebalancer's decision as a table: one snapshot per case (the view, this node's span,
the paces, the cool-down, the last re-plan's promise, the clock) and what `decide` makes of it,
each named for the end-to-end behaviour it stands for (tests/test_heal_e2e.py,
test_resplit_e2e.py, test_heterogeneous_e2e.py, test_handoff_e2e.py, the chaos rounds of
test_failover_e2e.py). Then the make-before-break sequence, round by round."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from harness.factories import member
from swarm import placement
from swarm.config import PlacementConfig
from swarm.rebalancing import policy
from swarm.rebalancing.decide import (
    PATIENT_HANDOFFS,
    Announce,
    AwaitTakers,
    CallOff,
    Decision,
    FetchCost,
    Inputs,
    Load,
    Reason,
    RebalanceState,
    Stay,
    announced,
    decide,
    describe,
    loaded,
    may_release,
)
from swarm.types import LayerSpan, MemberRecord, NodeId

LAYERS = 30  # as every member record says (harness.factories.member)
NOW = 1000.0
CONFIG = PlacementConfig()  # 15% threshold, 30 s cool-down, 30 s handoff timeout
NO_FETCH = FetchCost()  # every part is stored here
LACKS_11_20 = tuple(1000 if 11 <= i < 20 else 0 for i in range(LAYERS))  # bytes to fetch


def known(*records: MemberRecord, jitter: float = 0.0) -> dict[NodeId, tuple[float, ...]]:
    """Paces measured often enough for placement to know each member's noise: four samples
    alternating `jitter` (relative) either side of the record's pace."""
    paces = {}
    for r in records:
        ms = r.capacity.ms_per_layer_decode
        paces[r.node_id] = (ms * (1 - jitter), ms * (1 + jitter)) * 2
    return paces


def snapshot(
    me: MemberRecord,
    *others: MemberRecord,
    now: float = NOW,
    config: PlacementConfig = CONFIG,
    fetch: FetchCost = NO_FETCH,
    kept_positions: int = 0,
) -> Inputs:
    """This node `me` serving what its record announces, among `others`."""
    return Inputs(me, (me, *others), me.span, LAYERS, config, now, fetch, kept_positions)


def settled(*records: MemberRecord, **fields: object) -> RebalanceState:
    """A node that has watched these members long enough and moved long ago."""
    return dataclasses.replace(RebalanceState(paces=known(*records)), **fields)


# Three nodes on 30 layers, 10 each; the third ("me") measures `ms` ms per layer. The best
# plan moves it to 11:30 beside b (a 1.18x gain at 1.3 ms, 1.05x at 1.1 ms).
A, B = member("a", (0, 10), ms=1.0, layers=20), member("b", (10, 20), ms=1.0, layers=20)
SLOWER = member("me", (20, 30), ms=1.3, layers=20)
SLIGHTLY = member("me", (20, 30), ms=1.1, layers=20)
# A slowed node on a stage of its own (test_resplit_e2e.py's busy node, 10x slower).
ENTRY, THIRD = (
    member("entry", (0, 12), ms=2.5, layers=12),
    member("third", (21, 30), ms=2.7, layers=12),
)
SLOWED = member("me", (12, 24), ms=30.0, layers=12)


@dataclass(frozen=True)
class Case:
    why: str
    state: RebalanceState
    inputs: Inputs
    kind: type[Decision]
    reason: Reason
    target: tuple[int, int] | None = None
    shows: str = ""  # in what `describe` says of it


def _promised(*records: MemberRecord, gain: float) -> policy.Move:
    """A re-plan carried out (the swarm serves its plan now) that had promised `gain`, while
    the spans before it score the same as now: it delivered nothing."""
    running = placement.evaluate(records, LAYERS)
    return policy.Move(dict(running.spans), running, gain)


CASES = [
    Case(
        "a hole is filled at once, though this node moved 5 s ago (heal: a kill -9 of the"
        " only holder of 15:30, and a request waits on it)",
        settled(member("me"), member("b"), last_move_at=NOW - 5),
        snapshot(member("me", (0, 16), layers=16), member("b", (0, 16), layers=16)),
        Load,
        Reason.FILLS_A_HOLE,
        (15, 30),
    ),
    Case(
        "a leaving member's layers are planned as gone and taken over at once (a graceful"
        " leave covers before it goes)",
        settled(member("me"), member("a"), last_move_at=NOW - 1),
        snapshot(member("me", (0, 15), layers=30), member("a", (15, 30), draining=True)),
        Load,
        Reason.FILLS_A_HOLE,
        (0, 30),
    ),
    Case(
        "a move worth making waits out the cool-down (a swarm that just moved must not swing)",
        settled(A, B, SLOWER, last_move_at=NOW - 5),
        snapshot(SLOWER, A, B),
        Stay,
        Reason.COOLING_DOWN,
    ),
    Case(
        "past the cool-down, a gain over the threshold moves (heterogeneous: speed sets spans)",
        settled(A, B, SLOWER, last_move_at=NOW - 31),
        snapshot(SLOWER, A, B),
        Load,
        Reason.GAIN,
        (11, 30),
    ),
    Case(
        "a 1.05x gain under the 15% threshold is held: placement keeps the spans",
        settled(A, B, SLIGHTLY),
        snapshot(SLIGHTLY, A, B),
        Stay,
        Reason.IN_PLACE,
    ),
    Case(
        "paces jittering 30% raise the threshold to twice the noise, and hold a 1.18x gain"
        " (noise alone must never look like a gain)",
        RebalanceState(paces=known(A, B, SLOWER, jitter=0.3)),
        snapshot(SLOWER, A, B),
        Stay,
        Reason.IN_PLACE,
        shows="threshold 60%",
    ),
    Case(
        "the last re-plan delivered nothing of a 1.5x promise: its 50% shortfall holds a"
        " 1.18x gain (paces that depend on the plan must not swing it back and forth)",
        settled(A, B, SLOWER, promise=_promised(A, B, SLOWER, gain=1.5)),
        snapshot(SLOWER, A, B),
        Stay,
        Reason.IN_PLACE,
        shows="threshold 50%",
    ),
    Case(
        "a minute of fetching weights from peers doubles the threshold and holds a 1.18x gain",
        settled(A, B, SLOWER),
        snapshot(SLOWER, A, B, fetch=FetchCost(LACKS_11_20, 1000 * 9 / 60)),
        Stay,
        Reason.UNDER_THRESHOLD,
        shows="60 s to fetch",
    ),
    Case(
        "a minute of kept prompts to compute again (385 positions through 30 layers at 5.2 ms"
        " a layer) doubles the threshold and holds a 1.18x gain: a move drops them all",
        settled(A, B, SLOWER),
        snapshot(SLOWER, A, B, kept_positions=385),
        Stay,
        Reason.UNDER_THRESHOLD,
        shows="60 s of kept prompts",
    ),
    Case(
        "a chunk of kept prompt (10 s to compute again) does not hold a 1.18x gain",
        settled(A, B, SLOWER),
        snapshot(SLOWER, A, B, kept_positions=64),
        Load,
        Reason.GAIN,
        (11, 30),
    ),
    Case(
        "a node slowed 10x sheds layers in place, to 12:18 (resplit: the busy node gives"
        " layers away)",
        settled(ENTRY, SLOWED, THIRD),
        snapshot(SLOWED, ENTRY, THIRD),
        Load,
        Reason.GAIN,
        (12, 18),
    ),
    Case(
        "a joining node takes a span at once (resplit: the fourth node takes layers)",
        settled(member("a"), member("b")),
        snapshot(
            member("me", layers=12),
            member("a", (0, 16), ms=1.0, layers=16),
            member("b", (14, 30), ms=1.0, layers=16),
        ),
        Load,
        Reason.FIRST_SPAN,
        (0, 12),
    ),
    Case(
        "the members in place hold their spans while a newcomer's pace is unknown",
        settled(member("me"), member("b")),
        snapshot(
            member("me", (0, 16), ms=1.0, layers=16),
            member("new", ms=1.0, layers=12),
            member("b", (14, 30), ms=1.0, layers=16),
        ),
        Stay,
        Reason.IN_PLACE,
        shows="noise is unknown",
    ),
    Case(
        "a node 5x faster with memory for 10 layers serves 10, not its speed's share",
        settled(member("me", ms=0.2), member("a")),
        snapshot(
            member("me", (0, 10), ms=0.2, layers=10), member("a", (10, 30), ms=1.0, layers=30)
        ),
        Stay,
        Reason.IN_PLACE,
    ),
    Case(
        "the same node with memory for every layer serves them all beside the split",
        settled(member("me", ms=0.2), member("a")),
        snapshot(
            member("me", (0, 10), ms=0.2, layers=30), member("a", (10, 30), ms=1.0, layers=30)
        ),
        Load,
        Reason.GAIN,
        (0, 30),
    ),
    Case(
        "a draining node plans nothing: the others cover its layers",
        RebalanceState(),
        snapshot(dataclasses.replace(SLOWED, draining=True), ENTRY, THIRD),
        Stay,
        Reason.DRAINING,
    ),
    Case(
        "a pinned node moves to its span whatever the cool-down says",
        settled(A, B, SLOWER, last_move_at=NOW - 1),
        snapshot(SLOWER, A, B, config=dataclasses.replace(CONFIG, span="0:5")),
        Load,
        Reason.PINNED,
        (0, 5),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.why)
def test_decide(case: Case) -> None:
    decision = decide(case.state, case.inputs).decision
    assert isinstance(decision, case.kind), describe(decision)
    assert decision.reason is case.reason, describe(decision)
    assert case.shows in describe(decision)
    if case.target is not None:
        assert isinstance(decision, Load)
        assert decision.target == LayerSpan(*case.target)


def test_a_round_remembers_paces_and_the_plan_and_a_draining_round_nothing() -> None:
    state = RebalanceState()
    planned = decide(state, snapshot(SLOWER, A, B)).state
    assert planned.paces == {r.node_id: (r.capacity.ms_per_layer_decode,) for r in (A, B, SLOWER)}
    assert planned.plan is not None
    leaving = snapshot(dataclasses.replace(SLOWER, draining=True), A, B)
    assert decide(planned, leaving).state == planned


def test_a_re_plan_sets_out_a_promise_and_a_met_one_raises_no_bar() -> None:
    """The move to 11:30 promises its gain; once the swarm serves that plan at the paces
    that promised it, it delivered all of it: nothing is added to the threshold."""
    first = decide(settled(A, B, SLOWER), snapshot(SLOWER, A, B))
    promise = first.state.promise
    assert promise is not None and promise.gain == pytest.approx(1.18, abs=0.01)
    moved = [
        dataclasses.replace(r, span=first.state.plan.span_of(r.node_id)) for r in (SLOWER, A, B)
    ]
    after = decide(first.state, snapshot(*moved))
    assert after.state.missed == 0.0
    assert after.state.promise == promise
    assert isinstance(after.decision, Stay) and after.decision.reason is Reason.IN_PLACE


def test_make_before_break_loads_waits_for_the_taker_then_announces() -> None:
    """The slowed node gives 18:24 to the third node (planned 18:30). It keeps announcing
    12:24 while the third loads; it announces 12:18 once the third announces 18:30, after
    letting that news reach every entry (settle); the cool-down starts when it serves."""
    state = settled(ENTRY, SLOWED, THIRD)
    move = decide(state, snapshot(SLOWED, ENTRY, THIRD))
    assert isinstance(move.decision, Load)
    state = loaded(move.state, move.decision, NOW + 2)
    waiting = decide(state, snapshot(SLOWED, ENTRY, THIRD, now=NOW + 3))
    assert isinstance(waiting.decision, AwaitTakers)
    assert waiting.decision.waiting == tuple(LayerSpan(i, i + 1) for i in range(18, 21))
    taken = dataclasses.replace(THIRD, span=LayerSpan(18, 30))
    done = decide(waiting.state, snapshot(SLOWED, ENTRY, taken, now=NOW + 4)).decision
    assert done == Announce(Reason.HANDED_OFF, LayerSpan(12, 18), settle=True)
    state = announced(waiting.state, NOW + 5)
    assert state.handoff is None and state.last_move_at == NOW + 5
    serving = dataclasses.replace(SLOWED, span=LayerSpan(12, 18))
    after = decide(state, snapshot(serving, ENTRY, taken, now=NOW + 6)).decision
    assert isinstance(after, Stay) and after.reason is Reason.IN_PLACE


def test_a_taker_that_waits_on_no_one_is_waited_for_up_to_patient_handoffs_timeouts() -> None:
    """The third node only adds layers, so it waits on nobody: a slow loader. Past the
    handoff timeout the slowed node keeps waiting (said once), and gives up only after
    PATIENT_HANDOFFS timeouts, naming the layers left uncovered."""
    move = decide(settled(ENTRY, SLOWED, THIRD), snapshot(SLOWED, ENTRY, THIRD))
    assert isinstance(move.decision, Load)
    state = loaded(move.state, move.decision, NOW)
    timeout = CONFIG.handoff_timeout_s
    late = decide(state, snapshot(SLOWED, ENTRY, THIRD, now=NOW + timeout + 1))
    assert isinstance(late.decision, AwaitTakers) and late.decision.newly_patient
    later = decide(late.state, snapshot(SLOWED, ENTRY, THIRD, now=NOW + 2 * timeout))
    assert isinstance(later.decision, AwaitTakers) and not later.decision.newly_patient
    end = NOW + PATIENT_HANDOFFS * timeout
    gave_up = decide(later.state, snapshot(SLOWED, ENTRY, THIRD, now=end)).decision
    assert isinstance(gave_up, Announce) and gave_up.reason is Reason.GAVE_UP
    assert not gave_up.settle
    assert gave_up.abandoned == tuple(LayerSpan(i, i + 1) for i in range(18, 21))


def test_a_move_whose_taker_leaves_is_called_off_and_the_old_span_serves_on() -> None:
    """The slowed node gives 18:24 to the third node, which then says it leaves: nobody will
    take those layers, so the move is called off at once (waited out, the slowed node gave them
    up to nobody after the timeout, a hole until a re-plan loaded them again). Its next round
    plans without the leaving node from the span it kept."""
    move = decide(settled(ENTRY, SLOWED, THIRD), snapshot(SLOWED, ENTRY, THIRD))
    assert isinstance(move.decision, Load)
    state = loaded(move.state, move.decision, NOW)
    still = decide(state, snapshot(SLOWED, ENTRY, THIRD, now=NOW + 1))
    assert isinstance(still.decision, AwaitTakers)
    leaving = dataclasses.replace(THIRD, draining=True)
    off = decide(still.state, snapshot(SLOWED, ENTRY, leaving, now=NOW + 2))
    assert off.decision == CallOff(Reason.TAKER_LEAVING, LayerSpan(12, 18), (THIRD.node_id,))
    assert off.state.handoff is None and off.state.last_move_at == state.last_move_at
    assert describe(off.decision) == "calloff 12:18: taker_leaving"
    after = decide(off.state, snapshot(SLOWED, ENTRY, leaving, now=NOW + 3)).decision
    assert not isinstance(after, CallOff | Announce)  # planned anew, no handoff in progress


def test_a_leaving_taker_whose_layers_another_member_serves_is_not_waited_for() -> None:
    """Once another staying member announces the layers given up, a leaving taker does not
    matter: the move is handed off as ever."""
    move = decide(settled(ENTRY, SLOWED, THIRD), snapshot(SLOWED, ENTRY, THIRD))
    assert isinstance(move.decision, Load)
    state = loaded(move.state, move.decision, NOW)
    leaving = dataclasses.replace(THIRD, draining=True)
    cover = member("cover", (18, 30), ms=2.7, layers=12)
    done = decide(state, snapshot(SLOWED, ENTRY, leaving, cover, now=NOW + 1)).decision
    assert done == Announce(Reason.HANDED_OFF, LayerSpan(12, 18), settle=True)


def test_a_swap_gives_up_after_one_timeout() -> None:
    """Two nodes swapping spans each wait on the other: only the timeout ends the wait."""
    me, other = member("me", (15, 30)), member("a", (0, 15))
    swapped = placement.score(
        [me, other], {me.node_id: LayerSpan(0, 15), other.node_id: LayerSpan(15, 30)}, LAYERS
    )
    move = Load(Reason.GAIN, LayerSpan(0, 15), me.span, swapped, (me, other), 1.0, 0.15)
    state = loaded(RebalanceState(), move, NOW)
    before = decide(state, snapshot(me, other, now=NOW + CONFIG.handoff_timeout_s - 1)).decision
    assert isinstance(before, AwaitTakers)
    after = decide(state, snapshot(me, other, now=NOW + CONFIG.handoff_timeout_s)).decision
    assert isinstance(after, Announce) and after.reason is Reason.GAVE_UP


@pytest.mark.parametrize("current", [None, (10, 20)], ids=["first span", "pinned"])
def test_a_first_or_pinned_span_is_announced_without_waiting(
    current: tuple[int, int] | None,
) -> None:
    me = member("me", current)
    config = dataclasses.replace(CONFIG, span="0:5")
    move = decide(settled(me, A), snapshot(me, A, config=config)).decision
    assert isinstance(move, Load)
    state = loaded(RebalanceState(), move, NOW)
    done = decide(state, snapshot(me, A, config=config)).decision
    assert done == Announce(Reason.NOTHING_GIVEN_UP, LayerSpan(0, 5), settle=False)


def test_an_old_shard_goes_only_once_another_staying_member_serves_its_layers() -> None:
    """Releasing (after the announce): a retired shard's layers beyond the new span go once
    someone else serves them; alone, or covered only by a leaving member, they stay. That
    no session uses the shard any more, and the grace since it retired, is Serving's rule
    (tests/test_serving.py)."""
    layer, me = LayerSpan(20, 21), NodeId("me")
    taken = dataclasses.replace(THIRD, span=LayerSpan(18, 30))
    assert not may_release(layer, [THIRD], me)  # the taker still announces 21:30
    assert may_release(layer, [taken], me)
    assert not may_release(layer, [], me)
    assert not may_release(layer, [dataclasses.replace(taken, draining=True)], me)


# The third node joins a swarm whose two nodes hold 10:20 twice; the plan shrinks both and
# gives 10:20 to the newcomer, which loads it while they hand off.
TWICE, SHARER, NEWCOMER = member("me", (0, 20)), member("b", (10, 30)), member("c", None)


def _shrinking(b_after: tuple[int, int]) -> RebalanceState:
    """`me` has loaded 0:10 for a plan that moves b to `b_after` and c to 10:20."""
    planned = {
        TWICE.node_id: LayerSpan(0, 10),
        SHARER.node_id: LayerSpan(*b_after),
        NEWCOMER.node_id: LayerSpan(10, 20),
    }
    plan = placement.score([TWICE, SHARER, NEWCOMER], planned, LAYERS)
    move = Load(Reason.GAIN, LayerSpan(0, 10), TWICE.span, plan, (TWICE, SHARER), 1.0, 0.15)
    return loaded(RebalanceState(), move, NOW)


def test_members_giving_up_the_same_layers_do_not_count_on_each_other() -> None:
    """b still announces 10:30 while it hands off 10:20 too: taken for a cover, each of the
    two would announce its narrower span at once, and 10:20 would have no holder until the
    newcomer had loaded it (an entry's 503 "no live peer serves layers 10:20"). So `me`
    waits for the newcomer, the taker the plan names."""
    state = _shrinking(b_after=(20, 30))
    waiting = decide(state, snapshot(TWICE, SHARER, NEWCOMER, now=NOW + 1)).decision
    assert waiting == AwaitTakers(
        Reason.TAKERS_LOADING, tuple(LayerSpan(i, i + 1) for i in range(10, 20))
    )
    taken = dataclasses.replace(NEWCOMER, span=LayerSpan(10, 20))
    done = decide(state, snapshot(TWICE, SHARER, taken, now=NOW + 2)).decision
    assert done == Announce(Reason.HANDED_OFF, LayerSpan(0, 10), settle=True)


def test_a_member_the_plan_keeps_on_the_layers_given_up_is_their_cover() -> None:
    """Where the plan keeps b on 10:30, b's announcement is a cover that stays: `me` hands
    off at once; so does a member the plan does not know (it joined since) serving them."""
    state = _shrinking(b_after=(10, 30))
    kept = decide(state, snapshot(TWICE, SHARER, NEWCOMER, now=NOW + 1)).decision
    assert kept == Announce(Reason.HANDED_OFF, LayerSpan(0, 10), settle=True)
    state = _shrinking(b_after=(20, 30))
    later = member("d", (10, 20))
    joined = decide(state, snapshot(TWICE, SHARER, NEWCOMER, later, now=NOW + 1)).decision
    assert joined == Announce(Reason.HANDED_OFF, LayerSpan(0, 10), settle=True)


def test_a_chain_of_takers_ending_in_one_that_waits_on_no_one_is_waited_for() -> None:
    """`me` gives 5:10 to b, which gives 15:20 to c, which only adds layers: b waits on c,
    and c on no one. That is a chain, not two members waiting on each other: `me` waits past
    the timeout as for a slow loader, or it would drop 5:10 while b still waits for c (a
    hole until c has loaded). A cycle among the takers still ends at the timeout (above)."""
    me, b, c = member("me", (0, 10)), member("b", (10, 20)), member("c", (20, 30))
    planned = {me.node_id: LayerSpan(0, 5), b.node_id: LayerSpan(5, 15)}
    plan = placement.score([me, b, c], {**planned, c.node_id: LayerSpan(15, 30)}, LAYERS)
    move = Load(Reason.GAIN, LayerSpan(0, 5), me.span, plan, (me, b, c), 1.0, 0.15)
    state = loaded(RebalanceState(), move, NOW)
    late = decide(state, snapshot(me, b, c, now=NOW + CONFIG.handoff_timeout_s + 1))
    assert isinstance(late.decision, AwaitTakers) and late.decision.newly_patient
    assert policy.handoff_is_one_way(plan, (me, b, c), me.node_id, range(5, 10))
