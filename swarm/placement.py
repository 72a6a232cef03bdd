"""Placement: which contiguous span of decoder layers each node serves.

Pure: plain data in, a frozen plan out; no clocks, no randomness, no I/O. Every node runs the same
function on its view of the members and acts on its own line, so equal views give equal plans,
whatever the order of the records.

The model. A node's speed is 1000 / ms_per_layer_decode: tokens per second through
one layer. A node holding k layers runs each token through all k, and each of its steps costs
its fixed part (ms_per_step_fixed: the call's fixed part and the step's frame at the hop), so
it adds rate(k) = 1000 / (fixed + k x ms per layer) tokens per second to each of its layers
(speed / k without a fixed part; Petals divides by the layers used in the same way). A layer's
capacity is the sum over the nodes holding it; the predicted swarm throughput, the bottleneck,
is the minimum over layers. Memory caps k at capacity.max_layers().

The optimal plan is a pipeline of stages: consecutive layer ranges, each held in full by a group
of nodes (replicas), so a stage holding k layers has capacity R(k), its nodes' rate(k) summed,
which falls with k, and a route needs one hop per stage. For a target t, a group can hold the
largest k (up to the smallest max_layers in it) with R(k) >= t. Groups are runs of nodes in the
canonical order (most memory first, then fastest, then node id) so nodes of similar memory share
a stage, and a DP finds how many layers h groups can cover. The best bottleneck is the largest t
at which every layer is covered, found by binary search over the finitely many values R(k); the
plan takes the fewest stages within HOP_TIE_TOLERANCE of it, adds every node left over as a
replica of the weakest stage its memory can hold, then moves single nodes (to another stage,
out, or to an overlay holding the whole model beside the stages) while the bottleneck rises, and
sizes the stages to maximise their minimum. Overlapping spans other than whole-model overlays
are not considered, so on small models it can miss the best interval plan by a layer's rounding.
When memory cannot hold every layer, every node is chained from layer 0 and the rest is missing.

Stability: `plan` keeps the spans nodes already announce, places nodes without one on the window
that helps most, and switches to the optimal plan only when `should_move` says the gain passes
the threshold (hysteresis; the caller adds the cooldown, which needs a clock). The rest of the
move policy (the threshold from the paces' noise and a past move's missed gain, the fetch
cost, holes, handoffs) is the rebalancer's, in `swarm/rebalancing/policy.py`.

Cost: milliseconds for a home lab, about 1.5 s for 32 nodes and 80 layers (R(k) of every run
of the canonical order is tabled once per plan); call it off the event loop. The file runs past
~400 lines because the stage search and keep-and-fill share the scoring helpers.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from swarm.config import PlacementConfig
from swarm.errors import ConfigError, SpanError
from swarm.types import LayerSpan, MemberRecord, NodeId, uncovered_spans

HOP_TIE_TOLERANCE = 0.02  # a plan with fewer hops wins if its bottleneck is within this fraction
_EPS = 1e-9  # relative slack for floor(V / t) when t is exactly V / k
_ANY_SPEED = 1e-12  # tokens/s: a bottleneck low enough that every stage holds all it can

Spans = Mapping[NodeId, LayerSpan | None]


@dataclass(frozen=True)
class Plan:
    num_layers: int
    spans: tuple[tuple[NodeId, LayerSpan | None], ...]  # every node, sorted by node id
    layer_capacity: tuple[float, ...]  # tokens/s through each layer
    bottleneck: float  # tokens/s: the smallest layer capacity, 0 when a layer is missing
    hops: int | None  # fewest hops of any route through the plan; None when layers are missing
    missing: tuple[LayerSpan, ...]  # layers no node serves
    replicated: int = 0  # layers at least two nodes serve
    # ms one token takes through the fastest route, each hop's fixed cost included; None
    # when layers are missing
    latency_ms: float | None = None

    def span_of(self, node_id: NodeId) -> LayerSpan | None:
        return dict(self.spans).get(node_id)

    @property
    def covered(self) -> int:
        return self.num_layers - sum(len(span) for span in self.missing)

    @property
    def fully_replicated(self) -> bool:
        return self.replicated == self.num_layers


@dataclass(frozen=True)
class _Node:
    node_id: NodeId
    speed: float  # tokens/s through one layer; 0 for a record with unusable timings
    cap: int  # layers its memory holds, at most num_layers
    span: LayerSpan | None  # announced now
    resumes: LayerSpan | None = None  # served before its last stop, if it was stopped
    fixed_ms: float = 0.0  # what a step costs it beyond its layers

    def rate(self, layers: int) -> float:
        """Tokens/s it runs through a span of `layers` layers: a step costs its fixed part
        and each layer's pace."""
        if self.speed <= 0 or layers <= 0:
            return 0.0
        return 1000.0 / (self.fixed_ms + layers * 1000.0 / self.speed)

    def step_ms(self, layers: int) -> float:
        """Ms one token takes through `layers` of its layers."""
        return self.fixed_ms + layers * 1000.0 / self.speed

    @property
    def held(self) -> LayerSpan | None:
        """The span it holds now, or held before a restart while it holds none."""
        return self.span if self.span is not None else self.resumes


def node_speed(record: MemberRecord) -> float:
    """Tokens per second through one layer; 0 when the record's timing is unusable."""
    ms = record.capacity.ms_per_layer_decode
    return 1000.0 / ms if math.isfinite(ms) and ms > 0 else 0.0


def step_fixed_ms(record: MemberRecord) -> float:
    """What a step costs the node beyond its layers; 0 when its record does not say."""
    ms = record.capacity.ms_per_step_fixed
    return ms if math.isfinite(ms) and ms > 0 else 0.0


def predicted_rate(bottleneck: float, latency_ms: float | None, streams: int) -> float:
    """Tokens/s a plan of this bottleneck and route time (`Plan.latency_ms`) runs `streams`
    concurrent streams at: each stream has one token in flight, so together they make at
    most `streams` tokens per pass through the fastest route, and never more than the
    bottleneck. 0 while layers are missing."""
    if latency_ms is None or latency_ms <= 0 or streams < 1:
        return 0.0
    return min(bottleneck, streams * 1000.0 / latency_ms)


# --- public entry points ------------------------------------------------------------------------


def plan(records: Iterable[MemberRecord], num_layers: int, config: PlacementConfig) -> Plan:
    """What the rebalancer acts on: keep the current spans (placing nodes that have none) unless
    the optimal plan beats that by more than config.rebalance_threshold."""
    nodes = _nodes(records, num_layers)
    kept = _make_plan(nodes, _keep_and_fill(nodes, num_layers), num_layers)
    best = _make_plan(nodes, _optimal_spans(nodes, num_layers, HOP_TIE_TOLERANCE), num_layers)
    return best if should_move(kept, best, config.rebalance_threshold) else kept


def optimal_plan(
    records: Iterable[MemberRecord], num_layers: int, tie_tolerance: float = HOP_TIE_TOLERANCE
) -> Plan:
    """The best plan for this view, ignoring where nodes are now."""
    if not 0 <= tie_tolerance < 1:
        raise ConfigError(f"tie_tolerance must be in [0, 1), not {tie_tolerance}")
    nodes = _nodes(records, num_layers)
    return _make_plan(nodes, _optimal_spans(nodes, num_layers, tie_tolerance), num_layers)


def evaluate(records: Iterable[MemberRecord], num_layers: int) -> Plan:
    """The plan the swarm runs now: the spans the records announce."""
    nodes = _nodes(records, num_layers)
    return _make_plan(nodes, {n.node_id: n.span for n in nodes}, num_layers)


def score(records: Iterable[MemberRecord], spans: Spans, num_layers: int) -> Plan:
    """The plan `spans` would be with these members at their paces (members not in `spans`
    serve nothing)."""
    return _make_plan(_nodes(records, num_layers), spans, num_layers)


def limiting(plan: Plan) -> tuple[LayerSpan, tuple[NodeId, ...]] | None:
    """The layers whose capacity is the plan's bottleneck (the first such run) and the nodes
    serving them: what limits the swarm's throughput. None while layers are missing."""
    if plan.missing or not plan.layer_capacity:
        return None
    lowest = min(plan.layer_capacity)
    start = plan.layer_capacity.index(lowest)
    end = start
    while end < plan.num_layers and plan.layer_capacity[end] <= lowest * (1 + 1e-9):
        end += 1
    run = LayerSpan(start, end)
    nodes = tuple(n for n, span in plan.spans if span is not None and start in span)
    return run, nodes


def can_cover(records: Iterable[MemberRecord], num_layers: int) -> bool:
    """Whether these members can serve every layer once their moves are done, so that a layer
    none serves now is only moving: pinned members cover their own span (the one they load
    while they start: `resumes`), the others as many layers as their memory holds. Leaving
    members do not count."""
    staying = [r for r in records if not r.draining]
    fixed = {
        layer
        for r in staying
        if r.pinned
        for layer in (r.span if r.span is not None else r.resumes or ())
    }
    movable = sum(r.capacity.max_layers() for r in staying if not r.pinned)
    return len(fixed) + movable >= num_layers


def should_move(current: Plan, proposed: Plan, threshold: float) -> bool:
    """Covering more layers always wins, then a replica of every layer (one failure opens no
    hole); otherwise the bottleneck must rise by `threshold`. A few replicated layers count
    for nothing: a failure still opens a hole elsewhere, and keeping them must not hold a
    slow node on a long span (the overlap a move leaves behind would pin it there)."""
    if proposed.covered != current.covered:
        return proposed.covered > current.covered
    if proposed.fully_replicated != current.fully_replicated:
        return proposed.fully_replicated
    return proposed.bottleneck > current.bottleneck * (1.0 + threshold)


# --- the view -----------------------------------------------------------------------------------


def _nodes(records: Iterable[MemberRecord], num_layers: int) -> tuple[_Node, ...]:
    if num_layers < 1:
        raise SpanError(f"a model needs at least one layer, not {num_layers}")
    latest: dict[NodeId, MemberRecord] = {}
    for record in records:  # one record per node; a repeat keeps the highest incarnation
        seen = latest.get(record.node_id)
        if seen is None or (record.incarnation, repr(record)) > (seen.incarnation, repr(seen)):
            latest[record.node_id] = record
    return tuple(_node(latest[node_id], num_layers) for node_id in sorted(latest))


def _node(record: MemberRecord, num_layers: int) -> _Node:
    cap = max(0, min(record.capacity.max_layers(), num_layers))

    def fitting(span: LayerSpan | None) -> LayerSpan | None:
        return span if span is not None and span.end <= num_layers else None

    return _Node(
        record.node_id,
        node_speed(record),
        cap,
        fitting(record.span),
        fitting(record.resumes),
        step_fixed_ms(record),
    )


def _canonical(nodes: Iterable[_Node]) -> list[_Node]:
    """Usable nodes, most memory first, then fastest, then by node id."""
    usable = (n for n in nodes if n.speed > 0 and n.cap > 0)
    return sorted(usable, key=lambda n: (-n.cap, -n.speed, n.node_id))


# --- scoring a set of spans ---------------------------------------------------------------------


def _make_plan(nodes: Sequence[_Node], spans: Spans, num_layers: int) -> Plan:
    capacity, covered = _capacity(nodes, spans, num_layers)
    missing = uncovered_spans(covered)
    servers = [0] * num_layers
    for node in nodes:
        for layer in spans.get(node.node_id) or ():
            servers[layer] += node.speed > 0
    return Plan(
        num_layers=num_layers,
        spans=tuple((n.node_id, spans.get(n.node_id)) for n in nodes),
        layer_capacity=tuple(capacity),
        bottleneck=0.0 if missing else min(capacity),
        hops=None if missing else _fewest_hops(_served(nodes, spans), num_layers),
        missing=missing,
        replicated=sum(count >= 2 for count in servers),
        latency_ms=None if missing else _fastest_ms(nodes, spans, num_layers),
    )


def _capacity(
    nodes: Sequence[_Node], spans: Spans, num_layers: int
) -> tuple[list[float], list[bool]]:
    capacity = [0.0] * num_layers
    covered = [False] * num_layers
    for node in nodes:  # in node id order, so the float sums agree on every node
        span = spans.get(node.node_id)
        if span is None or node.speed <= 0:
            continue
        share = node.rate(len(span))
        for layer in span:
            capacity[layer] += share
            covered[layer] = True
    return capacity, covered


def _served(nodes: Sequence[_Node], spans: Spans) -> list[LayerSpan | None]:
    return [spans.get(n.node_id) for n in nodes if n.speed > 0]


def _fastest_ms(nodes: Sequence[_Node], spans: Spans, num_layers: int) -> float | None:
    """Ms of the fastest chain 0 -> num_layers: each hop costs its node's fixed part plus the
    layers it runs at its pace."""
    hops = [
        (span, node.step_ms)
        for node in nodes
        if node.speed > 0 and (span := spans.get(node.node_id)) is not None
    ]
    return _cheapest(hops, num_layers)


def _fewest_hops(spans: Iterable[LayerSpan | None], num_layers: int) -> int | None:
    """Hops of the shortest chain 0 -> num_layers."""
    found = _cheapest([(s, _one_hop) for s in spans if s is not None], num_layers)
    return None if found is None else round(found)


def _one_hop(layers: int) -> float:
    return 1.0


def _cheapest(
    hops: Sequence[tuple[LayerSpan, Callable[[int], float]]], num_layers: int
) -> float | None:
    """Cost of the cheapest chain 0 -> num_layers; a span [a, b) leads from any c in [a, b)
    to b at its cost of b - c layers."""
    best: list[float | None] = [0.0] + [None] * num_layers
    for boundary in range(num_layers):
        here = best[boundary]
        if here is None:
            continue
        for span, cost in hops:
            if span.start <= boundary < span.end:
                there, got = best[span.end], here + cost(span.end - boundary)
                best[span.end] = got if there is None else min(there, got)
    return best[num_layers]


# --- the optimal plan: stages of replica groups -------------------------------------------------


def _optimal_spans(nodes: Sequence[_Node], num_layers: int, tie_tolerance: float) -> Spans:
    """The fastest stages; when memory holds every layer twice and they leave a layer on a
    single node, the fastest stages of at least two nodes each (so one failure opens no hole)
    if those replicate every layer."""
    order = _canonical(nodes)
    spans: dict[NodeId, LayerSpan | None] = {n.node_id: None for n in nodes}
    if sum(n.cap for n in order) < num_layers:
        start = 0  # cannot cover everything: chain every node from layer 0, name the rest
        for node in order:
            spans[node.node_id] = LayerSpan(start, start + node.cap)
            start += node.cap
        return spans
    runs = _Runs(order)
    fastest = _stage_spans(nodes, runs, num_layers, tie_tolerance, 1)
    if _replicated(fastest, num_layers) or sum(n.cap for n in order) < 2 * num_layers:
        return fastest
    if _min_stages(runs, _ANY_SPEED, num_layers, 2) is None:  # no such stages hold the model
        return fastest
    safe = _stage_spans(nodes, runs, num_layers, tie_tolerance, 2)
    return safe if _replicated(safe, num_layers) else fastest


def _replicated(spans: Spans, num_layers: int) -> bool:
    servers = [0] * num_layers
    for span in spans.values():
        for layer in span or ():
            servers[layer] += 1
    return min(servers) >= 2


def _stage_spans(
    nodes: Sequence[_Node], runs: _Runs, num_layers: int, tie_tolerance: float, min_group: int
) -> Spans:
    """Stages of at least `min_group` nodes each (fewer where an overlay holds every layer)."""
    order = runs.order
    spans: dict[NodeId, LayerSpan | None] = {n.node_id: None for n in nodes}
    candidates = runs.targets()
    best = _largest(candidates, lambda t: _min_stages(runs, t, num_layers, min_group) is not None)
    target = best * (1.0 - tie_tolerance)
    # feasible: target <= best
    stages = _min_stages(runs, target, num_layers, min_group) or len(order)
    # the best bottleneck with that many stages; `target` itself passes, so one always does
    t = _largest(
        [target, *(c for c in candidates if c > target)],
        lambda t: (_min_stages(runs, t, num_layers, min_group) or stages + 1) <= stages,
    )
    groups = _grouping(runs, t, stages, num_layers, min_group)
    used = {n.node_id for group in groups for n in group}
    groups = _add_replicas(groups, [n for n in order if n.node_id not in used], num_layers)
    layout = _refine(_Layout(tuple(tuple(g) for g in groups)), num_layers, tie_tolerance, min_group)
    for node in layout.overlay:
        spans[node.node_id] = LayerSpan(0, num_layers)
    staged = list(zip(layout.stages, _stage_lengths(layout.stages, num_layers), strict=True))
    spans.update(_least_moving(staged))
    return spans


_ORDERS_TRIED = 6  # up to this many stages, every order of them is scored (6! = 720 orders)


def _chained(stages: Iterable[tuple[Sequence[_Node], int]]) -> dict[NodeId, LayerSpan | None]:
    spans: dict[NodeId, LayerSpan | None] = {}
    start = 0
    for group, length in stages:
        for node in group:
            spans[node.node_id] = LayerSpan(start, start + length) if length else None
        start += length
    return spans


def _least_moving(stages: Sequence[tuple[Sequence[_Node], int]]) -> dict[NodeId, LayerSpan | None]:
    """The stages chained in the order that keeps the most layers where they are served now.
    The bottleneck and the hops do not depend on the order, but the moves do: a node that
    shrinks in place drops layers its neighbour already holds instead of swapping spans with
    it (a swap makes each wait on the other, and loads twice the layers)."""

    nodes = [node for group, _ in stages for node in group]

    def kept(spans: Mapping[NodeId, LayerSpan | None]) -> int:
        return sum(_overlap(spans[node.node_id], node.held) for node in nodes)

    if len(stages) > _ORDERS_TRIED:
        return _chained(stages)
    # permutations yields the canonical order first, and max keeps the first of equals
    return max((_chained(order) for order in itertools.permutations(stages)), key=kept)


def _overlap(a: LayerSpan | None, b: LayerSpan | None) -> int:
    if a is None or b is None:
        return 0
    return max(0, min(a.end, b.end) - max(a.start, b.start))


class _Runs:
    """The tokens/s of every run order[i:j] of the canonical order as one stage, at each
    length its memory holds (up to its last node's cap, the run's smallest), computed once
    per order: the searches over bottlenecks read them many times over."""

    def __init__(self, order: Sequence[_Node]) -> None:
        self.order = tuple(order)
        self._rates: dict[tuple[int, int], tuple[float, ...]] = {}
        for j in range(1, len(order) + 1):
            acc = [0.0] * order[j - 1].cap  # acc[k - 1]: order[i:j] holding k layers
            for i in range(j - 1, -1, -1):
                node = order[i]
                for k in range(len(acc)):
                    acc[k] += node.rate(k + 1)
                self._rates[i, j] = tuple(acc)

    def layers(self, i: int, j: int, t: float) -> int:
        """Most layers order[i:j] holds as one stage at bottleneck t."""
        return _fits(self._rates[i, j], t)

    def targets(self) -> list[float]:
        """Every bottleneck a stage can have, ascending."""
        return sorted({rate for rates in self._rates.values() for rate in rates})


def _group_rates(group: Sequence[_Node]) -> tuple[float, ...]:
    """A stage's tokens/s at each length its memory holds: [k - 1] for k layers."""
    cap = min(n.cap for n in group)
    return tuple(_group_rate(group, k) for k in range(1, cap + 1))


def _group_rate(group: Sequence[_Node], layers: int) -> float:
    return sum(n.rate(layers) for n in group)


def _fits(rates: Sequence[float], t: float) -> int:
    """Layers a stage holds at bottleneck t: rates[k - 1], its tokens/s at k layers, falls
    with k, so they are the lengths at the front that reach t."""
    return bisect.bisect_right(rates, -t, key=lambda rate: -rate * (1.0 + _EPS))


def _largest(ascending: Sequence[float], feasible: Callable[[float], bool]) -> float:
    """The largest value that passes a test that holds for a prefix of `ascending`."""
    lo, hi = 0, len(ascending)  # feasible(ascending[i]) for i < lo; infeasible for i >= hi
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(ascending[mid]):
            lo = mid + 1
        else:
            hi = mid
    return ascending[lo - 1] if lo else ascending[0]


def _cover_table(
    runs: _Runs, t: float, num_layers: int, min_group: int
) -> tuple[list[list[int]], list[list[int | None]]]:
    """best[g][j]: most layers (capped at num_layers) that at most g groups, each a run of
    order[:j] of at least min_group nodes, cover at bottleneck t; back[g][j]: where the last
    group starts (None: order[j-1] is in no group)."""
    n = len(runs.order)
    groups = min(n, num_layers)
    best = [[0] * (n + 1) for _ in range(groups + 1)]
    back: list[list[int | None]] = [[None] * (n + 1) for _ in range(groups + 1)]
    for g in range(1, groups + 1):
        for j in range(1, n + 1):
            best[g][j] = best[g][j - 1]
            for i in range(j - min_group + 1):
                run = runs.layers(i, j, t)
                value = min(num_layers, best[g - 1][i] + run)
                if value > best[g][j]:
                    best[g][j], back[g][j] = value, i
    return best, back


def _min_stages(runs: _Runs, t: float, num_layers: int, min_group: int = 1) -> int | None:
    best, _ = _cover_table(runs, t, num_layers, min_group)
    return next((g for g in range(1, len(best)) if best[g][-1] >= num_layers), None)


def _grouping(
    runs: _Runs, t: float, stages: int, num_layers: int, min_group: int
) -> list[list[_Node]]:
    _, back = _cover_table(runs, t, num_layers, min_group)
    order = runs.order
    groups: list[list[_Node]] = []
    g, j = min(stages, len(back) - 1), len(order)
    while g > 0 and j > 0:
        i = back[g][j]
        if i is None:
            j -= 1
        else:
            groups.append(list(order[i:j]))
            g, j = g - 1, i
    return groups[::-1]


def _stage_lengths(groups: Sequence[Sequence[_Node]], num_layers: int) -> list[int]:
    """Lengths summing to num_layers that maximise the smallest stage capacity (its tokens/s
    at its length); the excess at the best bottleneck comes off the weakest stages first."""
    rates = [_group_rates(group) for group in groups]
    targets = sorted({rate for stage in rates for rate in stage})
    t = _largest(targets, lambda t: sum(_fits(stage, t) for stage in rates) >= num_layers)
    lengths = [_fits(stage, t) for stage in rates]
    for _ in range(sum(lengths) - num_layers):
        weakest = min(
            (i for i, k in enumerate(lengths) if k > 0),
            key=lambda i: (rates[i][lengths[i] - 1], -i),
        )
        lengths[weakest] -= 1
    return lengths


def _add_replicas(
    groups: list[list[_Node]], spares: Sequence[_Node], num_layers: int
) -> list[list[_Node]]:
    """Each spare node joins the weakest stage whose layers fit in its memory."""
    for spare in spares:
        lengths = _stage_lengths(groups, num_layers)
        fits = [i for i, k in enumerate(lengths) if 0 < k <= spare.cap]
        if fits:
            weakest = min(fits, key=lambda i: (_group_rate(groups[i], lengths[i]), i))
            groups[weakest] = [*groups[weakest], spare]
    return groups


@dataclass(frozen=True)
class _Layout:
    stages: tuple[tuple[_Node, ...], ...]  # consecutive layer ranges, each held by a group
    overlay: tuple[_Node, ...] = ()  # nodes holding every layer, next to the stages

    def bottleneck(self, num_layers: int) -> float:
        """-1 when the stages cannot hold every layer; an overlay adds its rate through all
        L layers everywhere."""
        extra = sum(n.rate(num_layers) for n in self.overlay)
        if not self.stages:
            return extra if self.overlay else -1.0
        stages = _stages_bottleneck(self.stages, num_layers)
        return -1.0 if stages < 0 else stages + extra

    def hops(self) -> int:
        return 1 if self.overlay else len(self.stages)


_OVERLAY = -1
_MAX_MOVES = 1000


def _refine(layout: _Layout, num_layers: int, tie_tolerance: float, min_group: int) -> _Layout:
    """Move one node at a time to another stage, to the overlay or out of the plan while that
    raises the bottleneck, or saves a hop and stays within tie_tolerance of the best seen. Runs
    in the canonical order miss groupings such as a big slow node sharing the stage of a small
    one, and stages alone miss a big node holding the whole model beside a split."""
    score = peak = layout.bottleneck(num_layers)
    for _ in range(_MAX_MOVES):  # each move gains or saves a hop; the cap only guards the loop
        for candidate in _moves(layout, num_layers, min_group):
            got = candidate.bottleneck(num_layers)
            fewer = candidate.hops() < layout.hops() and got >= peak * (1.0 - tie_tolerance)
            if got > score * (1.0 + _EPS) or fewer:
                layout, score, peak = candidate, got, max(peak, got)
                break
        else:
            break
    return layout


def _moves(layout: _Layout, num_layers: int, min_group: int) -> Iterator[_Layout]:
    placed = [(i, n) for i, group in enumerate(layout.stages) for n in group]
    placed += [(_OVERLAY, n) for n in layout.overlay]
    for where, node in placed:
        for to in [*range(len(layout.stages)), _OVERLAY, None]:
            if to == where or (to == _OVERLAY and node.cap < num_layers):
                continue
            stages = [[n for n in group if n is not node] for group in layout.stages]
            overlay = [n for n in layout.overlay if n is not node]
            if to == _OVERLAY:
                overlay.append(node)
            elif to is not None:
                stages[to].append(node)
            kept = tuple(tuple(g) for g in stages if g)
            if overlay or all(len(g) >= min_group for g in kept):
                yield _Layout(kept, tuple(overlay))


def _stages_bottleneck(groups: Sequence[Sequence[_Node]], num_layers: int) -> float:
    """The bottleneck of stages sized by _stage_lengths; -1 when they cannot hold every layer."""
    if not groups or sum(min(n.cap for n in g) for g in groups) < num_layers:
        return -1.0
    lengths = _stage_lengths(groups, num_layers)
    return min(_group_rate(g, k) for g, k in zip(groups, lengths, strict=True) if k > 0)


# --- keeping the current spans ------------------------------------------------------------------


def _keep_and_fill(nodes: Sequence[_Node], num_layers: int) -> dict[NodeId, LayerSpan | None]:
    """Announced spans that still fit stay; a node started again takes back the span it
    served before its stop where it fits and nobody serves any of those layers now; each
    other usable node without one, in canonical order, takes the window that helps the plan
    most."""
    spans = {
        n.node_id: n.span if n.span is not None and len(n.span) <= n.cap else None for n in nodes
    }
    # layers served now otherwise than before a stop: a node that serves the span it came
    # back to is the old layout returning, and the replicas it had come back beside it
    taken = [spans[n.node_id] for n in nodes if n.span != n.resumes]
    for node in _canonical(nodes):
        back = node.resumes
        if spans[node.node_id] is not None or back is None or len(back) > node.cap:
            continue
        if not any(_overlap(back, s) for s in taken):
            spans[node.node_id] = back
    for node in _canonical(nodes):
        if spans[node.node_id] is None:
            spans[node.node_id] = _best_window(node, nodes, spans, num_layers)
    return spans


def _windows(node: _Node, spans: Spans, num_layers: int) -> list[LayerSpan]:
    """Windows that line up with the spans already placed, or fill memory from one of them."""
    edges = {0, num_layers} | {b for s in spans.values() if s is not None for b in (s.start, s.end)}
    found = {(a, b) for a in edges for b in edges if 0 < b - a <= node.cap}
    found |= {(a, min(num_layers, a + node.cap)) for a in edges if a < num_layers}
    found |= {(max(0, b - node.cap), b) for b in edges if b > 0}
    return [LayerSpan(a, b) for a, b in sorted(found)]


def _best_window(
    node: _Node, nodes: Sequence[_Node], spans: Spans, num_layers: int
) -> LayerSpan | None:
    """Most layers covered, then the highest bottleneck, then fewest hops, longest, earliest."""
    scored: list[tuple[tuple[int, float], LayerSpan]] = []
    for window in _windows(node, spans, num_layers):
        capacity, covered = _capacity(nodes, {**spans, node.node_id: window}, num_layers)
        scored.append(((sum(covered), min(capacity)), window))
    if not scored:
        return None
    top = max(score for score, _ in scored)
    tied = [w for score, w in scored if score == top]

    def hops(w: LayerSpan) -> int:
        found = _fewest_hops([*_served(nodes, spans), w], num_layers)
        return num_layers + 1 if found is None else found

    return min(tied, key=lambda w: (hops(w), -len(w), w.start))


def covered_by_others(
    span: LayerSpan | None, records: Iterable[MemberRecord], me: NodeId, *, alone: bool = True
) -> bool:
    """Whether the members other than `me` that are not leaving serve every layer of `span`.
    `alone` is the answer when no such member exists."""
    staying = [r for r in records if r.node_id != me and not r.draining]
    if span is None:
        return True
    if not staying:
        return alone
    return all(any(r.span is not None and layer in r.span for r in staying) for layer in span)
