"""Routing: the chain of nodes one step of a request goes through.

Pure: plain data in, a frozen route out. The search is Dijkstra over layer boundaries 0..L: a
node announcing [a, b) is an edge from every boundary c in [a, b) to b, running layers [c, b).
An edge costs its expected time in milliseconds:

    layers x ms per layer per token x (1 + queue depth + sessions x row share)  compute
    + the asker's own work there                                               its heads
    + rtt / 2                                                                  getting there
    + hop overhead                                                             framing, scheduling

The load factor says each compute job already waiting there runs before ours and takes about as
long (the gossiped queue depth is seconds old and does not see sessions that start together).
A step of each session the asking entry already routes through the node joins ours in one
batched call, which each of them makes longer by the node's measured row share of a lone row
(`Capacity.decode_row_share`: near 1 where products are compute-bound, so sessions spread over
replicas as before; well below 1 where a batch costs little more than a row, so a fast replica
batches a handful of sessions rather than handing some to a slower one). An entry
that serves layers itself also runs the head of every session it is the entry of on the same
compute thread; that work waits ahead of a step through its own hop whatever the route, so a
replica elsewhere takes the sessions its own hop cannot fit beside it. Ties go to
fewer hops, then to the smaller sequence of node ids, so every entry picks the same route from
the same inputs.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from swarm.errors import NoRouteError, SpanError
from swarm.types import Hop, LayerSpan, MemberRecord, NodeId, uncovered_spans

# a batch is never free: each session in it costs at least this share of a lone row, so a
# share measured at 0 (noise, or a batch that costs what a row does) still spreads sessions
# over equal replicas instead of sending every one to the same node
_MIN_ROW_SHARE = 0.05


@dataclass(frozen=True)
class RouteQuery:
    num_layers: int
    kv_bytes_per_layer: int = 0  # KV bytes the session needs per layer run; 0 skips the check
    exclude: frozenset[NodeId] = frozenset()  # peers never to use (failed, draining)
    rtt_ms: Mapping[NodeId, float] = field(default_factory=dict)  # measured round trips, ms
    sessions: Mapping[NodeId, int] = field(default_factory=dict)  # the asker's, through each
    # ms of compute per token the asker itself runs on a node outside any hop (its heads)
    own_work_ms: Mapping[NodeId, float] = field(default_factory=dict)
    default_rtt_ms: float = 1.0  # ms, for a peer with no measured round trip yet
    hop_overhead_ms: float = 0.5  # ms per hop: serialisation, framing, scheduling

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise SpanError(f"a model needs at least one layer, not {self.num_layers}")
        for name in ("kv_bytes_per_layer", "default_rtt_ms", "hop_overhead_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, not {value}")


@dataclass(frozen=True)
class Route:
    hops: tuple[Hop, ...]
    cost_ms: float  # expected time of a step through all of them

    @property
    def nodes(self) -> tuple[NodeId, ...]:
        return tuple(hop.node_id for hop in self.hops)


def find_route(records: Iterable[MemberRecord], query: RouteQuery) -> Route:
    """The cheapest chain of hops through layers 0..num_layers; NoRouteError when none exists."""
    peers = _usable(records, query)
    best: dict[int, tuple[float, int, tuple[NodeId, ...]]] = {0: (0.0, 0, ())}
    heap: list[tuple[float, int, tuple[NodeId, ...], int]] = [(0.0, 0, (), 0)]
    done: set[int] = set()
    while heap:
        cost, hops, path, boundary = heapq.heappop(heap)
        if boundary in done:
            continue
        done.add(boundary)
        if boundary == query.num_layers:
            return _route(path, peers, query)
        for peer in peers.values():
            step = _edge_cost(peer, boundary, query)
            if step is None or peer.span is None or peer.span.end in done:
                continue
            key = (cost + step, hops + 1, (*path, peer.node_id))
            if key < best.get(peer.span.end, (math.inf, 0, ())):
                best[peer.span.end] = key
                heapq.heappush(heap, (*key, peer.span.end))
    raise _no_route(peers, query, max(done))


def hop_cost_ms(record: MemberRecord, layers: int, query: RouteQuery) -> float:
    """Expected milliseconds for `record` to run `layers` layers of a decode step, there
    included."""
    return (
        _compute_ms(record, layers, query.sessions.get(record.node_id, 0))
        + max(0.0, query.own_work_ms.get(record.node_id, 0.0))
        + _rtt(record.node_id, query) / 2
        + query.hop_overhead_ms
    )


def _compute_ms(record: MemberRecord, layers: int, sessions: int) -> float:
    """Expected milliseconds of `record`'s layers for one more step, batched with a step of
    each of `sessions` sessions, after the compute jobs it says are waiting."""
    capacity = record.capacity
    share = min(1.0, max(_MIN_ROW_SHARE, capacity.decode_row_share))
    load = 1 + max(0, record.load.queue_depth) + max(0, sessions) * share
    return layers * capacity.ms_per_layer_decode * load


def _rtt(node_id: NodeId, query: RouteQuery) -> float:
    rtt = query.rtt_ms.get(node_id, query.default_rtt_ms)
    return rtt if math.isfinite(rtt) and rtt >= 0 else query.default_rtt_ms


def _usable(records: Iterable[MemberRecord], query: RouteQuery) -> dict[NodeId, MemberRecord]:
    """Peers announcing a span inside the model, not excluded, with usable timings; by node id.
    A node listed twice keeps its highest incarnation."""
    latest: dict[NodeId, MemberRecord] = {}
    for record in records:
        seen = latest.get(record.node_id)
        if seen is None or (record.incarnation, repr(record)) > (seen.incarnation, repr(seen)):
            latest[record.node_id] = record
    return {
        node_id: latest[node_id]
        for node_id in sorted(latest)
        if node_id not in query.exclude and _serves(latest[node_id], query)
    }


def _serves(record: MemberRecord, query: RouteQuery) -> bool:
    if record.span is None or record.span.end > query.num_layers:
        return False
    ms = record.capacity.ms_per_layer_decode
    return math.isfinite(ms) and ms > 0


def _edge_cost(peer: MemberRecord, boundary: int, query: RouteQuery) -> float | None:
    """The cost of entering `peer` at `boundary`, or None when it cannot run from there."""
    span = peer.span
    if span is None or not span.start <= boundary < span.end:
        return None
    layers = span.end - boundary
    if peer.load.kv_free_bytes < layers * query.kv_bytes_per_layer:
        return None
    return hop_cost_ms(peer, layers, query)


def _route(
    path: Sequence[NodeId], peers: Mapping[NodeId, MemberRecord], query: RouteQuery
) -> Route:
    hops: list[Hop] = []
    cost_ms, start = 0.0, 0
    for node_id in path:
        peer = peers[node_id]
        end = peer.span.end if peer.span is not None else start  # usable peers have a span
        hops.append(Hop(node_id, peer.address, LayerSpan(start, end)))
        cost_ms += hop_cost_ms(peer, end - start, query)
        start = end
    return Route(tuple(hops), cost_ms)


def _no_route(
    peers: Mapping[NodeId, MemberRecord], query: RouteQuery, reached: int
) -> NoRouteError:
    covered = [False] * query.num_layers
    for peer in peers.values():
        if peer.span is not None:
            for layer in peer.span:
                covered[layer] = True
    missing = uncovered_spans(covered)
    if missing:
        where = ", ".join(str(span) for span in missing)
        excluded = f" ({len(query.exclude)} peers excluded)" if query.exclude else ""
        return NoRouteError(f"no live peer serves layers {where}{excluded}", missing)
    return NoRouteError(
        f"no peer with enough free KV cache runs on from layer {reached}",
        (LayerSpan(reached, query.num_layers),),
    )
