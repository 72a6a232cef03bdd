"""Copies share the load, as tables: placement gives nodes that each hold a model whole
copies of it rather than a split, whatever their memory and whatever other models the swarm
serves; the copies a served model lists; and where an entry runs a request for a model it
holds whole: here while it is alone or the others are as busy, else on a less loaded copy."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.factories import MODEL, member, plan_spans
from swarm import placement
from swarm.config import PlacementConfig
from swarm.model_routing import members_of, served_models, spread
from swarm.schema import Copy, Coverage, ServedModel
from swarm.types import LayerSpan, Load, MemberRecord, ModelId, NodeId

CODER = ModelId("c0de" * 6)  # a second model, of 4 layers


def coder(name: str, **fields: object) -> MemberRecord:
    return member(name, **{"model_id": CODER, "num_layers": 4, **fields})


# ---- placement: copies, not a split --------------------------------------------------------


@dataclass(frozen=True)
class Placed:
    what: str
    members: list[MemberRecord]
    model: ModelId
    layers: int
    spans: dict[str, tuple[int, int] | None]


WHOLE, CODER_WHOLE = (0, 30), (0, 4)
PLACED = [
    Placed("three equal nodes", [member("a"), member("b"), member("c")], MODEL, 30, {}),
    Placed(
        "three nodes of different memory, each holding the model",
        [member("a", layers=30), member("b", layers=60), member("c", layers=100)],
        MODEL,
        30,
        {},
    ),
    Placed(
        "three nodes of different paces",
        [member("a", ms=0.5), member("b"), member("c", ms=2.0)],
        MODEL,
        30,
        {},
    ),
    Placed(
        "the first model's copies beside a second model's members",
        [member("a"), coder("x"), member("b"), coder("y"), member("c", layers=30)],
        MODEL,
        30,
        {},
    ),
    Placed(
        "the second model's copies beside the first's members",
        [member("a"), coder("x", layers=4), member("b"), coder("y", layers=50)],
        CODER,
        4,
        {"x": CODER_WHOLE, "y": CODER_WHOLE},
    ),
]


def test_two_nodes_that_hold_the_model_stay_copies_beside_two_that_split_it() -> None:
    """Fresh nodes: the two that hold the model take it whole and the two halves split it
    beside them, one hop for any route, at the bottleneck of the best plan (which finds an
    equal one of two stages of two nodes each, and so does not move them)."""
    records = [member("a", layers=30), member("b", layers=30)]
    records += [member("c", layers=15), member("d", layers=15)]
    plan = placement.plan(records, 30, PlacementConfig())
    assert plan_spans(plan) == {"a": WHOLE, "b": WHOLE, "c": (0, 15), "d": (15, 30)}
    assert plan.hops == 1
    assert plan.bottleneck == pytest.approx(placement.optimal_plan(records, 30).bottleneck)


def _whole_for_all(case: Placed) -> dict[str, tuple[int, int] | None]:
    own = members_of(case.members, case.model)
    return case.spans or {str(r.node_id): (0, case.layers) for r in own}


@pytest.mark.parametrize("case", PLACED, ids=[c.what for c in PLACED])
def test_nodes_that_each_hold_a_model_get_whole_copies_of_it(case: Placed) -> None:
    own = members_of(case.members, case.model)
    fresh = placement.plan(own, case.layers, PlacementConfig())  # nodes that serve nothing yet
    best = placement.optimal_plan(own, case.layers)
    assert plan_spans(fresh) == plan_spans(best) == _whole_for_all(case)
    assert fresh.hops == best.hops == 1


def test_a_node_too_small_for_the_model_splits_with_a_copy_holder_where_that_is_faster() -> None:
    """Two copies and a node holding half the model: one copy holder and the small node
    serve the model as two halves beside the other copy, since each of their layers then
    runs at 1000/15 + 1000/30 tokens/s against 1000/30 + 1000/30 with the small node
    idle beside two copies (the plan's throughput for concurrent requests)."""
    records = [member("a", layers=30), member("b", layers=30), member("c", layers=15)]
    plan = placement.plan(records, 30, PlacementConfig())
    assert plan_spans(plan) == {"a": WHOLE, "b": (0, 15), "c": (15, 30)}
    whole = LayerSpan(*WHOLE)
    copies = placement.score(records, {NodeId("a"): whole, NodeId("b"): whole}, 30)
    assert plan.bottleneck == pytest.approx(100.0) and copies.bottleneck == pytest.approx(2000 / 30)


# ---- the copies a model lists ---------------------------------------------------------------


def test_a_model_lists_its_whole_copies_with_their_pace_and_load() -> None:
    here = member("a", WHOLE, load=Load(active_sessions=1))
    alive = [
        here,
        member("b", WHOLE, ms=2.0, load=Load(active_sessions=2, queue_depth=1)),
        member("c", (0, 15)),  # a part: a request cannot run there from end to end
        member("d", WHOLE, draining=True),  # leaving
        member("e", WHOLE, ms=float("inf")),  # no pace measured
        coder("x", span=CODER_WHOLE),
    ]
    own, other = served_models(alive, here)
    assert own.copies == (
        Copy("a:7070", 30.0, 1, here=True),
        Copy("b:7070", 60.0, 3),
    )
    assert other.copies == (Copy("x:7070", 4.0, 0),)


# ---- where a request runs --------------------------------------------------------------------

COVERED = Coverage(True, (), 30, 1.0)


def copies(*listed: Copy) -> ServedModel:
    return ServedModel("chat", MODEL, 30, COVERED, here=True, copies=listed)


HERE = Copy("a:7070", 30.0, 0, here=True)
SPREAD = [
    # (what, the model, requests here now, sent to each copy and running, where it runs)
    ("a lone request stays here", copies(HERE, Copy("b:7070", 30.0, 0)), 0, {}, None),
    ("no other copy: here", copies(HERE), 3, {}, None),
    ("busy here, an idle copy: there", copies(HERE, Copy("b:7070", 30.0, 0)), 1, {}, "b:7070"),
    ("as busy there as here: here", copies(HERE, Copy("b:7070", 30.0, 1)), 1, {}, None),
    (
        "the copy with the fewest sessions",
        copies(HERE, Copy("b:7070", 30.0, 2), Copy("c:7070", 30.0, 1)),
        3,
        {},
        "c:7070",
    ),
    (
        "requests sent there and not yet in its gossip count",
        copies(HERE, Copy("b:7070", 30.0, 0), Copy("c:7070", 30.0, 0)),
        2,
        {"b:7070": 2, "c:7070": 1},
        "c:7070",
    ),
    (
        "its gossip counts past what was sent: the larger",
        copies(HERE, Copy("b:7070", 30.0, 3)),
        2,
        {"b:7070": 1},
        None,
    ),
    (
        "a copy twice as slow takes the third request, not the second",
        copies(HERE, Copy("b:7070", 60.0, 0)),
        1,
        {},
        None,
    ),
    ("... the third", copies(HERE, Copy("b:7070", 60.0, 0)), 2, {}, "b:7070"),
    (
        "a gain under SPREAD_GAIN stays here",
        copies(HERE, Copy("b:7070", 58.0, 0)),
        1,
        {},
        None,
    ),
    (
        "this node holds no copy (a part): its route decides, not the spread",
        copies(Copy("b:7070", 30.0, 0)),
        5,
        {},
        None,
    ),
    (
        "a faster copy takes even the second request",
        copies(HERE, Copy("b:7070", 10.0, 0)),
        1,
        {},
        "b:7070",
    ),
]


@pytest.mark.parametrize(
    ("what", "model", "load", "sent", "where"), SPREAD, ids=[s[0] for s in SPREAD]
)
def test_a_request_runs_here_unless_a_copy_gives_its_tokens_sooner(
    what: str, model: ServedModel, load: int, sent: dict[str, int], where: str | None
) -> None:
    assert spread(model, load, sent) == where


def test_six_requests_at_once_spread_two_to_each_of_three_copies() -> None:
    """What the entry does as six streams arrive together, before any gossip: each goes
    where `spread` says, and each counts there from then on."""
    model = copies(HERE, Copy("b:7070", 30.0, 0), Copy("c:7070", 30.0, 0))
    here, sent = 0, {"b:7070": 0, "c:7070": 0}
    for _ in range(6):
        where = spread(model, here, sent)
        if where is None:
            here += 1
        else:
            sent[where] += 1
    assert (here, sent) == (2, {"b:7070": 2, "c:7070": 2})
