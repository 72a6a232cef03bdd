from __future__ import annotations

from dataclasses import dataclass
from random import Random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.factories import member, plan_spans
from swarm.config import PlacementConfig
from swarm.errors import ConfigError, SpanError
from swarm.placement import evaluate, node_speed, optimal_plan, plan, should_move
from swarm.types import LayerSpan, MemberRecord, NodeId


@dataclass(frozen=True)
class Case:
    name: str
    members: list[MemberRecord]
    num_layers: int
    spans: dict[str, tuple[int, int] | None]
    bottleneck: float
    hops: int | None
    missing: tuple[tuple[int, int], ...] = ()


CASES = [
    Case(
        "a node 3x faster serves 3x the layers",
        [member("fast", ms=1 / 3, layers=30), member("b", layers=10), member("c", layers=10)],
        50,
        {"fast": (0, 30), "b": (30, 40), "c": (40, 50)},
        100.0,
        3,
    ),
    Case(
        "slow nodes share a stage as replicas, sized against the fast one",
        [member("fast", ms=1 / 3, layers=20), member("b", layers=20), member("c", layers=20)],
        30,
        {"fast": (0, 18), "b": (18, 30), "c": (18, 30)},
        1000 / 6,
        2,
    ),
    Case(
        "equal nodes that each hold the model replicate it: one hop",
        [member("a"), member("b")],
        30,
        {"a": (0, 30), "b": (0, 30)},
        2000 / 30,
        1,
    ),
    Case(
        "a node holding the whole model serves it beside a split of smaller ones",
        [member("a", layers=15), member("b", layers=15), member("big", layers=40)],
        30,
        {"a": (0, 15), "b": (15, 30), "big": (0, 30)},
        1000 / 15 + 1000 / 30,
        1,
    ),
    Case(
        "memory splits the model; ties go by node id",
        [member("b", layers=20), member("a", layers=20)],
        30,
        {"a": (0, 15), "b": (15, 30)},
        1000 / 15,
        2,
    ),
    Case(
        "a node measured 3x slower takes the layers the fast one cannot hold",
        [member("a", layers=30), member("b", layers=10, ms=3.0)],
        40,
        {"a": (0, 30), "b": (30, 40)},
        1000 / 30,
        2,
    ),
    Case(
        "a small, slow node that would be the bottleneck serves nothing",
        [member("a", layers=30), member("b", ms=100, layers=2)],
        30,
        {"a": (0, 30), "b": None},
        1000 / 30,
        1,
    ),
    Case(
        "not enough memory: the missing layers are named",
        [member("a", layers=10), member("b", layers=10)],
        30,
        {"a": (0, 10), "b": (10, 20)},
        0.0,
        None,
        ((20, 30),),
    ),
    Case(
        "nodes with unusable timings serve nothing",
        [member("a", ms=0.0), member("b", ms=float("nan"))],
        4,
        {"a": None, "b": None},
        0.0,
        None,
        ((0, 4),),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_optimal_plan(case: Case) -> None:
    got = optimal_plan(case.members, case.num_layers)
    assert plan_spans(got) == case.spans
    assert got.bottleneck == pytest.approx(case.bottleneck)
    assert got.hops == case.hops
    assert got.missing == tuple(LayerSpan(a, b) for a, b in case.missing)


def test_evaluate_sums_each_nodes_share_per_layer() -> None:
    got = evaluate([member("a", (0, 2)), member("b", (1, 3)), member("c")], 3)
    assert got.layer_capacity == pytest.approx((500.0, 1000.0, 500.0))
    assert (got.bottleneck, got.hops, got.missing) == (500.0, 2, ())
    assert got.span_of(NodeId("c")) is None


def test_evaluate_names_gaps_and_ignores_spans_outside_the_model() -> None:
    got = evaluate([member("a", (1, 2)), member("b", (3, 9))], 5)
    assert got.missing == (LayerSpan(0, 1), LayerSpan(2, 5))
    assert (got.bottleneck, got.hops, got.covered) == (0.0, None, 1)


@dataclass(frozen=True)
class Move:
    name: str
    members: list[MemberRecord]
    num_layers: int
    spans: dict[str, tuple[int, int] | None]
    threshold: float = 0.15


MOVES = [
    Move(
        "as fast, and a replica of every layer fits in memory: move",
        [member("a", (0, 15)), member("b", (15, 30))],
        30,
        {"a": (0, 30), "b": (0, 30)},
    ),
    Move(
        "nearly as good: everyone keeps their layers",
        [member("a", (0, 15), layers=20), member("b", (15, 30), layers=20)],
        30,
        {"a": (0, 15), "b": (15, 30)},
    ),
    Move(
        "a newcomer takes the window that helps most, the others stay",
        [member("a", (0, 15)), member("b", (15, 30)), member("c")],
        30,
        {"a": (0, 15), "b": (15, 30), "c": (0, 30)},
    ),
    Move(
        "gain under the threshold: stay",
        [member("a", (0, 16), layers=16), member("b", (16, 30), layers=16)],
        30,
        {"a": (0, 16), "b": (16, 30)},
    ),
    Move(
        "the same gain over a lower threshold: move",
        [member("a", (0, 16), layers=16), member("b", (16, 30), layers=16)],
        30,
        {"a": (0, 15), "b": (15, 30)},
        threshold=0.05,
    ),
    Move(
        "a lopsided split: move",
        [member("a", (0, 25)), member("b", (25, 30))],
        30,
        {"a": (0, 30), "b": (0, 30)},
    ),
    Move(
        "a node left and its layers are missing: re-plan to cover them",
        [member("b", (15, 30))],
        30,
        {"b": (0, 30)},
    ),
    Move(
        "a node started again takes back the layers it served, not the first window",
        [member("a", layers=11, resumes=LayerSpan(11, 22))],
        30,
        {"a": (11, 22)},
    ),
    Move(
        "a lab started again whole comes back as it was, whoever starts first",
        [
            member("a", layers=11, resumes=LayerSpan(11, 22)),
            member("b", layers=11, resumes=LayerSpan(22, 30)),
            member("c", layers=11, resumes=LayerSpan(0, 11)),
        ],
        30,
        {"a": (11, 22), "b": (22, 30), "c": (0, 11)},
    ),
    Move(
        "a replica comes back beside the node that came back to the same layers",
        [
            member("a", (0, 15), layers=15, resumes=LayerSpan(0, 15)),
            member("b", layers=15, resumes=LayerSpan(0, 15)),
            member("c", layers=15, resumes=LayerSpan(15, 30)),
            member("d", layers=15, resumes=LayerSpan(15, 30)),
        ],
        30,
        {"a": (0, 15), "b": (0, 15), "c": (15, 30), "d": (15, 30)},
    ),
    Move(
        "the layers it served are served by another now: it takes the best window",
        [member("a", (0, 15)), member("b", (15, 30)), member("c", resumes=LayerSpan(10, 20))],
        30,
        {"a": (0, 15), "b": (15, 30), "c": (0, 30)},
    ),
    Move(
        "a node that serves a span never moves back to the one before its restart",
        [
            member("a", (0, 15), layers=15, resumes=LayerSpan(15, 30)),
            member("b", (15, 30), layers=15),
        ],
        30,
        {"a": (0, 15), "b": (15, 30)},
    ),
    Move(
        "the span it served no longer fits its memory: the best window instead",
        [
            member("a", layers=10, resumes=LayerSpan(5, 20)),
            member("b", (0, 10), layers=10),
            member("c", (20, 30), layers=10),
        ],
        30,
        {"a": (10, 20), "b": (0, 10), "c": (20, 30)},
    ),
    Move(
        "a span that no longer fits in memory is given up",
        [member("a", (0, 20), layers=10), member("b", (0, 30))],
        30,
        {"a": (0, 10), "b": (0, 30)},
        threshold=1.0,
    ),
]


@pytest.mark.parametrize("case", MOVES, ids=lambda c: c.name)
def test_plan_keeps_current_spans_unless_the_gain_is_worth_it(case: Move) -> None:
    config = PlacementConfig(rebalance_threshold=case.threshold)
    assert plan_spans(plan(case.members, case.num_layers, config)) == case.spans


def test_should_move() -> None:
    covered = evaluate([member("a", (0, 10))], 10)
    half = evaluate([member("a", (0, 5))], 10)
    faster = evaluate([member("a", (0, 10), ms=0.5)], 10)
    assert should_move(half, covered, 0.15)
    assert not should_move(covered, half, 0.15)
    assert should_move(covered, faster, 0.15)
    assert not should_move(covered, faster, 1.0)
    assert not should_move(half, half, 0.0)


def test_node_speed_is_tokens_per_second_through_one_layer() -> None:
    assert node_speed(member("a", ms=4.0)) == 250.0
    assert node_speed(member("a", ms=-1.0)) == 0.0


def test_bad_inputs_are_typed_errors() -> None:
    with pytest.raises(SpanError):
        optimal_plan([member("a")], 0)
    with pytest.raises(ConfigError):
        optimal_plan([member("a")], 4, tie_tolerance=1.0)


def test_a_repeated_node_keeps_its_highest_incarnation() -> None:
    old = member("a", (0, 2))
    new = member("a", (0, 4), incarnation=2)
    assert evaluate([new, old], 4).span_of(NodeId("a")) == LayerSpan(0, 4)
    assert evaluate([old, new], 4) == evaluate([new, old], 4)


# --- properties ---------------------------------------------------------------------------------

SPEEDS = st.sampled_from([0.25, 0.5, 1.0, 2.0, 3.0])


@st.composite
def views(draw: st.DrawFn) -> tuple[list[MemberRecord], int]:
    num_layers = draw(st.integers(1, 12))
    count = draw(st.integers(1, 5))
    members = []
    for i in range(count):
        layers = draw(st.integers(0, num_layers + 2))
        span = None
        if draw(st.booleans()):
            start = draw(st.integers(0, num_layers - 1))
            span = (start, draw(st.integers(start + 1, num_layers)))
        members.append(member(f"n{i}", span, ms=draw(SPEEDS), layers=layers))
    return members, num_layers


@settings(max_examples=60, deadline=None)
@given(views(), st.randoms(use_true_random=False))
def test_the_same_view_in_any_order_gives_the_same_plan(
    view: tuple[list[MemberRecord], int], rng: Random
) -> None:
    members, num_layers = view
    shuffled = list(members)
    rng.shuffle(shuffled)
    assert optimal_plan(shuffled, num_layers) == optimal_plan(members, num_layers)
    assert plan(shuffled, num_layers, PlacementConfig()) == plan(
        members, num_layers, PlacementConfig()
    )


@settings(max_examples=60, deadline=None)
@given(views())
def test_plans_respect_memory_and_cover_every_layer_when_memory_allows(
    view: tuple[list[MemberRecord], int],
) -> None:
    members, num_layers = view
    room = sum(min(m.capacity.max_layers(), num_layers) for m in members)
    for got in (optimal_plan(members, num_layers), plan(members, num_layers, PlacementConfig())):
        caps = {m.node_id: m.capacity.max_layers() for m in members}
        for node, span in got.spans:
            assert span is None or (len(span) <= caps[node] and span.end <= num_layers)
        assert (got.missing == ()) == (room >= num_layers)
        assert got.covered == num_layers - sum(len(s) for s in got.missing)


@settings(max_examples=60, deadline=None)
@given(views())
def test_the_plan_is_never_worse_than_what_runs_now(view: tuple[list[MemberRecord], int]) -> None:
    members, num_layers = view
    fits = [m for m in members if m.span is None or len(m.span) <= m.capacity.max_layers()]
    now = evaluate(fits, num_layers)
    got = plan(fits, num_layers, PlacementConfig())
    assert got.covered >= now.covered
    if got.covered == now.covered:
        assert got.bottleneck >= now.bottleneck


def test_the_limiting_layers_and_nodes_are_named() -> None:
    from swarm.placement import limiting

    # a serves 0:10 at 1 ms per layer (100 tok/s over its span); b serves 10:30 at 2 ms (25)
    members = [member("a", (0, 10), ms=1.0), member("b", (10, 30), ms=2.0)]
    assert limiting(evaluate(members, 30)) == (LayerSpan(10, 30), (NodeId("b"),))
    # a fast replica beside b lifts 10:30 (25 + 250 tok/s) above a's layers: a limits now
    members.append(member("c", (10, 30), ms=0.2))
    assert limiting(evaluate(members, 30)) == (LayerSpan(0, 10), (NodeId("a"),))
    # nothing limits a swarm that cannot serve at all
    assert limiting(evaluate([member("a", (0, 10))], 30)) is None


def test_layers_are_only_moving_when_the_members_can_serve_them_after_their_moves() -> None:
    from dataclasses import replace

    from swarm.placement import can_cover

    a, b = member("a", (0, 15), layers=15), member("b", (15, 30), layers=15)
    assert can_cover([a, b], 30) and not can_cover([a], 30)
    assert not can_cover([a, replace(b, draining=True)], 30)  # b leaves
    # a member pinned to its span never takes other layers, however much memory it has
    big_pinned = replace(member("c", (0, 15), layers=100), pinned=True)
    assert not can_cover([big_pinned], 30)
    assert can_cover([big_pinned, replace(b, pinned=True)], 30)
    # a pinned member still loading its span (announced as the span it resumes) covers it;
    # one that announces neither covers nothing
    loading = replace(b, pinned=True, span=None, resumes=LayerSpan(15, 30))
    assert can_cover([big_pinned, loading], 30)
    assert not can_cover([big_pinned, replace(loading, resumes=None)], 30)
    assert not can_cover([big_pinned, replace(loading, draining=True)], 30)


@pytest.mark.parametrize(
    "ms",
    [(1.0, 1.0, 1.0, 1.0), (1.0, 0.77, 1.25, 0.9), (0.5, 1.0, 1.0, 2.0), (1.0, 1.0, 1.0, 3.0)],
)
def test_where_memory_holds_every_layer_twice_every_layer_has_two_servers(
    ms: tuple[float, ...],
) -> None:
    """Four nodes with memory for half the model each, at any speeds: two stages of two,
    never a plan that leaves a layer on one node (one failure would open a hole)."""
    members = [member(f"n{i}", ms=m, layers=15) for i, m in enumerate(ms)]
    best = optimal_plan(members, 30)
    assert best.replicated == 30, plan_spans(best)
    assert plan(members, 30, PlacementConfig()).replicated == 30


def test_without_room_for_two_copies_placement_goes_for_speed() -> None:
    members = [member("fast", ms=1 / 3, layers=20), member("b", layers=20), member("c", layers=20)]
    assert optimal_plan(members, 30).replicated < 30  # two copies need stages of two nodes


def test_a_slow_node_sheds_layers_even_where_its_span_overlaps_a_neighbour() -> None:
    """Three layers left on two nodes by an earlier move are no reason to keep a node that
    became 10x slower on twelve layers: the plan moves them off it."""
    members = [
        member("entry", (0, 12), ms=2.5, layers=12),
        member("slowed", (12, 24), ms=30.0, layers=12),
        member("third", (21, 30), ms=2.7, layers=12),
    ]
    planned = plan(members, 30, PlacementConfig(rebalance_threshold=0.4))
    after = plan_spans(planned)
    assert after["slowed"] is not None
    assert after == {"entry": (0, 12), "slowed": (12, 18), "third": (18, 30)}  # no swap
    assert planned.bottleneck > 1.9 * evaluate(members, 30).bottleneck
