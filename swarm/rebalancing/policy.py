"""The rebalancer's move policy: the rules `decide.py` applies to whether and when this node
moves to its planned span, as pure functions over plans and member records.

`swarm/placement.py` searches for the plan (the spans that maximise the minimum over layers
of the summed speeds, under memory, fewest hops) and keeps the spans the nodes announce
unless that plan beats them by a threshold (`placement.should_move`). The rules here set that
threshold and what else a move must pass: each member planned at the median of its recent
paces, a threshold of at least twice their noise and of what the last re-plan fell short of
its promise, a move that fills a hole skipping it, the time to fetch the move's weights
raising it, and whom a handoff waits for.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from swarm.config import PlacementConfig
from swarm.placement import Plan, Spans, score, should_move
from swarm.types import MemberRecord, NodeId

PACE_SAMPLES = 5  # recent decode paces per member that placement takes the median of
PACES_TO_MOVE = 3  # a member with fewer recent paces holds every span, its noise unknown
NOISE_MARGIN = 2.0  # a move's gain must pass this many times the paces' relative deviation
MAX_MISSED_GAIN = 0.5  # the most a past move's missed promise adds to the gain a move must show

Paces = Mapping[NodeId, tuple[float, ...]]  # each member's last decode paces, ms per layer


# --- paces and the threshold --------------------------------------------------------------------


def remember_paces(
    paces: Paces, records: Iterable[MemberRecord]
) -> dict[NodeId, tuple[float, ...]]:
    """The last PACE_SAMPLES decode paces of each member in `records`, this view's added."""
    return {
        r.node_id: (*paces.get(r.node_id, ()), r.capacity.ms_per_layer_decode)[-PACE_SAMPLES:]
        for r in records
    }


def steady(
    records: Iterable[MemberRecord], paces: Paces, config: PlacementConfig
) -> tuple[tuple[MemberRecord, ...], PlacementConfig]:
    """What to plan with under noisy measurements: each member at the median of its recent
    paces (a real change wins once it holds for most of them), and a threshold of at least
    NOISE_MARGIN times the noise, the median relative deviation of every recent pace from
    its member's median, so noise alone never looks like a gain. While a member has fewer
    than PACES_TO_MOVE paces the noise is unknown: only covering or replicating more moves."""
    steadied, deviations, known = [], [], True
    for record in records:
        recent = [ms for ms in paces.get(record.node_id, ()) if math.isfinite(ms) and ms > 0]
        known = known and len(recent) >= PACES_TO_MOVE
        if not recent:
            steadied.append(record)
            continue
        median = statistics.median(recent)
        deviations += [abs(ms - median) / median for ms in recent]
        capacity = dataclasses.replace(record.capacity, ms_per_layer_decode=median)
        steadied.append(dataclasses.replace(record, capacity=capacity))
    noise = statistics.median(deviations) if deviations else 0.0
    threshold = max(config.rebalance_threshold, NOISE_MARGIN * noise) if known else math.inf
    return tuple(steadied), dataclasses.replace(config, rebalance_threshold=threshold)


@dataclass(frozen=True)
class Move:
    """A re-plan the swarm set out to carry out, and the gain it promised."""

    before: Spans  # what the members served when it was decided
    after: Plan
    gain: float  # after.bottleneck / the bottleneck of `before`, at the paces of the decision

    @classmethod
    def of(cls, running: Plan, proposed: Plan) -> Move | None:
        """The move from `running` to `proposed`; None when it only covers layers (a gain from
        nothing promises no ratio)."""
        if running.bottleneck <= 0 or proposed.bottleneck <= 0:
            return None
        gain = proposed.bottleneck / running.bottleneck
        return cls(dict(running.spans), proposed, gain)


def missed_gain(move: Move, running: Plan, records: Iterable[MemberRecord]) -> float | None:
    """How much more `move` promised than it delivered, as a fraction (at most MAX_MISSED_GAIN):
    its promised gain over the gain its plan shows now, both plans scored with the same,
    current paces (`running`: `evaluate` of `records`); None while the swarm does not serve
    the move's plan.

    Paces on a machine whose nodes share cores, or whose entry also runs the head, depend on
    the plan: taking layers from one node and giving them to another changes both nodes'
    measured paces, and the plan that looked better may look worse once carried out. A swarm
    that re-plans on such a shift swings back and forth; a gain must pass what the last move
    missed by."""
    if running.spans != move.after.spans:
        return None
    before = score(records, move.before, running.num_layers).bottleneck
    if before <= 0 or running.bottleneck <= 0:
        return None
    delivered = running.bottleneck / before
    return min(max(move.gain / delivered - 1.0, 0.0), MAX_MISSED_GAIN)


# --- whether a move is worth making -------------------------------------------------------------


def fills_a_hole(current: Plan, proposed: Plan) -> bool:
    """Whether the proposed plan serves layers that no live member serves now: requests wait
    on such a move (net.coverage_wait_s), so nothing that paces moves may hold it back."""
    return proposed.covered > current.covered


def worth_moving(
    current: Plan, proposed: Plan, threshold: float, cost_s: float, payback_s: float
) -> bool:
    """should_move for one node whose move costs `cost_s` seconds: weights fetched from its
    peers (bytes / measured link bandwidth) and kept prompts computed again. Every
    `payback_s` of cost adds another `threshold` to the gain the move must promise, so a slow
    link, or a swarm holding many conversations, moves only for a big win. Covering more
    layers still always wins."""
    return should_move(current, proposed, threshold * (1.0 + max(cost_s, 0.0) / payback_s))


# --- handing off --------------------------------------------------------------------------------


def not_taken(
    plan: Plan, records: Sequence[MemberRecord], me: NodeId, dropped: Sequence[int]
) -> tuple[int, ...]:
    """The `dropped` layers of `me` that no other staying member both announces and keeps
    under `plan`. A member the plan moves off a layer announces it until its own handoff
    ends: two members giving up the same layers would each take the other for their cover and
    drop them at once, leaving them to a taker still loading. A member the plan does not
    know (it joined since) counts by what it announces."""
    planned = dict(plan.spans)

    def keeps(record: MemberRecord, layer: int) -> bool:
        if record.node_id == me or record.draining or record.span is None:
            return False
        after = planned.get(record.node_id, record.span)
        return layer in record.span and after is not None and layer in after

    return tuple(layer for layer in dropped if not any(keeps(r, layer) for r in records))


def handoff_is_one_way(
    plan: Plan,
    records: Sequence[MemberRecord],
    me: NodeId,
    dropped: Sequence[int],
    waiting: frozenset[NodeId] = frozenset(),
) -> bool:
    """Whether the members `plan` gives the `dropped` layers of `me` to can each announce
    their new spans without waiting on `me`: every one of them is alive in `records` and
    gives up no layer that nobody keeps, or gives those up to members that, in turn, wait on
    no one (a chain ends with a member that only adds layers). Then `me` may wait for them
    as long as they take to load (a slow machine loading must not open a gap). Otherwise the
    moves wait on each other (two nodes swapping spans: a taker is in `waiting`, the members
    up the chain) and only a timeout ends the wait."""
    current = {r.node_id: r for r in records}
    takers = _takers(plan, me, dropped)
    if not takers:
        return False
    up_the_chain = waiting | {me}
    for taker in takers:
        record = current.get(taker)
        if record is None or record.draining or taker in up_the_chain:
            return False
        after = plan.span_of(taker)
        given_up = [i for i in record.span or () if after is None or i not in after]
        untaken = not_taken(plan, records, taker, given_up)
        if untaken and not handoff_is_one_way(plan, records, taker, untaken, up_the_chain):
            return False
    return True


def leaving_takers(
    plan: Plan, records: Sequence[MemberRecord], me: NodeId, dropped: Sequence[int]
) -> tuple[NodeId, ...]:
    """The members `plan` gives the `dropped` layers of `me` to that say in `records` that
    they leave: they will never take them."""
    draining = {r.node_id for r in records if r.draining}
    return tuple(sorted(_takers(plan, me, dropped) & draining))


def _takers(plan: Plan, me: NodeId, dropped: Sequence[int]) -> set[NodeId]:
    """The members other than `me` that `plan` gives any of the `dropped` layers to."""
    return {
        node
        for node, span in plan.spans
        if node != me and span is not None and any(layer in span for layer in dropped)
    }
