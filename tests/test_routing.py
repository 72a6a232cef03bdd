from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.factories import member
from swarm.errors import NoRouteError, SpanError
from swarm.membership.wire_format import record_from_wire, record_to_wire
from swarm.routing import Route, RouteQuery, find_route, hop_cost_ms
from swarm.types import LayerSpan, MemberRecord, NodeId
from swarm.wire.fields import Fields


def query(num_layers: int = 10, **kwargs: object) -> RouteQuery:
    defaults: dict[str, object] = {"default_rtt_ms": 0.0, "hop_overhead_ms": 0.0}
    return RouteQuery(num_layers, **{**defaults, **kwargs})  # type: ignore[arg-type]


def chain(route: Route) -> list[tuple[str, int, int]]:
    return [(hop.node_id, hop.span.start, hop.span.end) for hop in route.hops]


@dataclass(frozen=True)
class Case:
    name: str
    peers: list[MemberRecord]
    chain: list[tuple[str, int, int]]
    cost_ms: float
    query: dict[str, object] = field(default_factory=dict)


CASES = [
    Case("one node serves everything", [member("a", (0, 10))], [("a", 0, 10)], 10.0),
    Case(
        "a chain in layer order",
        [member("b", (5, 10)), member("a", (0, 5))],
        [("a", 0, 5), ("b", 5, 10)],
        10.0,
    ),
    Case(
        "the faster replica wins",
        [member("a", (0, 10), ms=2.0), member("b", (0, 10), ms=1.0)],
        [("b", 0, 10)],
        10.0,
    ),
    Case(
        "a hop entered mid-span runs only the rest of it",
        [member("a", (0, 8)), member("b", (4, 10), ms=0.5)],
        [("a", 0, 8), ("b", 8, 10)],
        9.0,
    ),
    Case(
        "entering a fast node early can beat a long slow hop",
        [member("a", (0, 4), ms=2.0), member("c", (0, 8), ms=2.0), member("b", (4, 10), ms=0.5)],
        [("a", 0, 4), ("b", 4, 10)],
        11.0,
    ),
    Case(
        "equal cost: fewer hops",
        [member("a", (0, 5)), member("b", (5, 10)), member("c", (0, 10))],
        [("c", 0, 10)],
        10.0,
    ),
    Case(
        "equal cost and hops: the smaller node id",
        [member("b", (0, 10)), member("a", (0, 10))],
        [("a", 0, 10)],
        10.0,
    ),
    Case(
        "the round trip and per-hop overhead count",
        [member("a", (0, 5)), member("b", (5, 10)), member("c", (0, 10), ms=1.1)],
        [("c", 0, 10)],
        11.0 + 0.5 + 1.0,
        {"rtt_ms": {NodeId("c"): 1.0}, "default_rtt_ms": 1.0, "hop_overhead_ms": 1.0},
    ),
    Case(
        "a far peer loses to a near one",
        [member("a", (0, 10)), member("b", (0, 10))],
        [("b", 0, 10)],
        10.5,
        {"rtt_ms": {NodeId("a"): 50.0, NodeId("b"): 1.0}},
    ),
    Case(
        "an unusable round trip counts as the default",
        [member("a", (0, 10))],
        [("a", 0, 10)],
        12.0,
        {"rtt_ms": {NodeId("a"): float("nan")}, "default_rtt_ms": 4.0},
    ),
    Case(
        "queued jobs make a busy node slower",
        [member("a", (0, 10), queue=2), member("b", (0, 10), ms=2.0)],
        [("b", 0, 10)],
        20.0,
    ),
    Case(
        "a peer measured slower costs more",
        [member("a", (0, 10), ms=3.0), member("b", (0, 10), ms=2.0)],
        [("b", 0, 10)],
        20.0,
    ),
    Case(
        "excluded peers are routed around",
        [member("a", (0, 10)), member("b", (0, 5), ms=2), member("c", (5, 10), ms=2)],
        [("b", 0, 5), ("c", 5, 10)],
        20.0,
        {"exclude": frozenset({NodeId("a")})},
    ),
    Case(
        "a peer without KV room for the session is skipped",
        [member("a", (0, 10), kv_free=99), member("b", (0, 10), ms=2.0, kv_free=100)],
        [("b", 0, 10)],
        20.0,
        {"kv_bytes_per_layer": 10},
    ),
    Case(
        "KV room for the rest of a span is enough",
        [member("a", (0, 6), ms=2.0), member("b", (0, 10), kv_free=40)],
        [("a", 0, 6), ("b", 6, 10)],
        16.0,
        {"kv_bytes_per_layer": 10},
    ),
    Case(
        "peers announcing no span or a span outside the model are ignored",
        [member("a", None), member("b", (0, 12)), member("c", (0, 10), ms=3.0)],
        [("c", 0, 10)],
        30.0,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_find_route(case: Case) -> None:
    route = find_route(case.peers, query(**case.query))
    assert chain(route) == case.chain
    assert route.cost_ms == pytest.approx(case.cost_ms)
    assert route.nodes == tuple(node for node, _, _ in case.chain)
    assert route.hops[0].address == f"{case.chain[0][0]}:7070"


@pytest.mark.parametrize(
    ("peers", "q", "missing", "message"),
    [
        ([], query(4), [(0, 4)], "no live peer serves layers 0:4"),
        ([member("a", (0, 2)), member("b", (3, 4))], query(4), [(2, 3)], "layers 2:3"),
        (
            [member("a", (0, 4)), member("b", (0, 2))],
            query(4, exclude=frozenset({NodeId("a")})),
            [(2, 4)],
            r"layers 2:4 \(1 peers excluded\)",
        ),
        (
            [member("a", (0, 2)), member("b", (0, 4), kv_free=15)],
            query(4, kv_bytes_per_layer=10),
            [(2, 4)],
            "enough free KV cache runs on from layer 2",
        ),
    ],
)
def test_no_route_names_the_missing_layers(
    peers: list[MemberRecord], q: RouteQuery, missing: list[tuple[int, int]], message: str
) -> None:
    with pytest.raises(NoRouteError, match=message) as raised:
        find_route(peers, q)
    assert raised.value.missing == tuple(LayerSpan(a, b) for a, b in missing)


def test_a_repeated_node_keeps_its_highest_incarnation() -> None:
    old = member("a", (0, 4))
    new = replace(old, incarnation=2, span=LayerSpan(0, 10))
    assert chain(find_route([new, old], query())) == [("a", 0, 10)]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"num_layers": 0}, SpanError),
        ({"hop_overhead_ms": -1.0}, ValueError),
        ({"default_rtt_ms": float("inf")}, ValueError),
        ({"kv_bytes_per_layer": -1}, ValueError),
    ],
)
def test_a_bad_query_is_refused(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        query(**kwargs)


# --- properties ---------------------------------------------------------------------------------


@st.composite
def swarms(draw: st.DrawFn) -> tuple[list[MemberRecord], RouteQuery]:
    num_layers = draw(st.integers(1, 8))
    peers = []
    for i in range(draw(st.integers(0, 5))):
        start = draw(st.integers(0, num_layers - 1))
        end = draw(st.integers(start + 1, num_layers))
        ms = draw(st.sampled_from([0.5, 1.0, 2.0]))
        peers.append(member(f"n{i}", (start, end), ms=ms, queue=draw(st.integers(0, 2))))
    ids = [p.node_id for p in peers]
    exclude = frozenset(draw(st.lists(st.sampled_from(ids), max_size=2))) if ids else frozenset()
    rtt = {node: draw(st.sampled_from([0.0, 1.0, 5.0])) for node in ids}
    return peers, RouteQuery(num_layers, exclude=exclude, rtt_ms=rtt, hop_overhead_ms=0.3)


def cheapest_by_brute_force(peers: Sequence[MemberRecord], q: RouteQuery) -> float | None:
    """The cheapest chain, trying every sequence of distinct usable peers."""
    usable = [p for p in peers if p.node_id not in q.exclude and p.span is not None]
    best: float | None = None
    for size in range(1, len(usable) + 1):
        for order in itertools.permutations(usable, size):
            at, cost = 0, 0.0
            for p in order:
                assert p.span is not None
                if not p.span.start <= at < p.span.end:
                    break
                cost += hop_cost_ms(p, p.span.end - at, q)
                at = p.span.end
            else:
                if at == q.num_layers and (best is None or cost < best):
                    best = cost
    return best


@settings(max_examples=80, deadline=None)
@given(swarms())
def test_routes_chain_every_layer_once_avoid_excluded_peers_and_are_cheapest(
    swarm: tuple[list[MemberRecord], RouteQuery],
) -> None:
    peers, q = swarm
    best = cheapest_by_brute_force(peers, q)
    try:
        route = find_route(peers, q)
    except NoRouteError as error:
        assert best is None
        served = {layer for p in peers if p.node_id not in q.exclude and p.span for layer in p.span}
        missing = {layer for span in error.missing for layer in span}
        assert missing == set(range(q.num_layers)) - served
        return
    assert best is not None and route.cost_ms == pytest.approx(best)
    assert [layer for hop in route.hops for layer in hop.span] == list(range(q.num_layers))
    assert not set(route.nodes) & q.exclude
    assert find_route(list(reversed(peers)), q) == route


def replica(name: str, ms: float, share: float) -> MemberRecord:
    """A node serving the whole 10-layer model whose batched call grows by `share` of a
    lone row's time with each further row."""
    record = member(name, (0, 10), ms=ms)
    return replace(record, capacity=replace(record.capacity, decode_row_share=share))


def assigned(peers: Sequence[MemberRecord], sessions: int) -> dict[str, int]:
    """Sessions routed one after another by one entry, each seeing those before it: how many
    each peer took."""
    through: dict[NodeId, int] = {}
    for _ in range(sessions):
        (node,) = find_route(peers, query(sessions=dict(through))).nodes
        through[node] = through.get(node, 0) + 1
    return {p.node_id: through.get(p.node_id, 0) for p in peers}


@pytest.mark.parametrize(
    ("peers", "sessions", "expected"),
    [
        # compute-bound products (a row costs in a batch what it costs alone): spread
        ([replica("a", 1.0, 1.0), replica("b", 1.0, 1.0)], 4, {"a": 2, "b": 2}),
        ([replica("fast", 1.0, 1.0), replica("slow", 3.0, 1.0)], 8, {"fast": 6, "slow": 2}),
        # a batch costs little more than a row: the fast replica batches a handful alone,
        # and the slow one takes sessions only once the fast one's batch outgrows it
        ([replica("fast", 1.0, 0.25), replica("slow", 3.0, 0.25)], 8, {"fast": 8, "slow": 0}),
        ([replica("fast", 1.0, 0.25), replica("slow", 3.0, 0.25)], 12, {"fast": 11, "slow": 1}),
        # equal replicas still share: each session makes a batch a little longer
        ([replica("a", 1.0, 0.25), replica("b", 1.0, 0.25)], 4, {"a": 2, "b": 2}),
        # a node that does not say (an older one) counts each session as a whole step
        ([member("fast", (0, 10)), replica("slow", 3.0, 0.25)], 8, {"fast": 5, "slow": 3}),
    ],
    ids=["even", "compute-bound", "batched", "batched-outgrown", "equal-batched", "unsaid"],
)
def test_sessions_go_where_their_batch_is_fastest(
    peers: list[MemberRecord], sessions: int, expected: dict[str, int]
) -> None:
    assert assigned(peers, sessions) == expected


def test_a_batch_is_never_free() -> None:
    """A measured share of 0 (noise, or a batch as fast as a row) still makes each session
    cost a little, so equal replicas share sessions rather than one taking every one."""
    assert assigned([replica("a", 1.0, 0.0), replica("b", 1.0, 0.0)], 4) == {"a": 2, "b": 2}


def test_the_row_share_travels_in_the_record_and_an_unsaid_one_is_a_whole_row() -> None:
    sent = replica("a", 1.0, 0.3)
    assert record_from_wire(Fields(record_to_wire(sent), "record")) == sent
    fields = record_to_wire(sent)
    capacity = fields["cap"]
    assert isinstance(capacity, dict)
    del capacity["row_share"]
    assert record_from_wire(Fields(fields, "record")).capacity.decode_row_share == 1.0
