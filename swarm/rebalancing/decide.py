"""What the rebalancer decides, as pure functions over immutable snapshots (sans-I/O).

The loop (`swarm/rebalancing/loop.py`) owns the clock, the view and the shards. Each round it
gathers `Inputs` and calls `decide(state, inputs)`, which returns an `Outcome`: the decision
and the new `RebalanceState`, everything the loop must remember until the next round. When it
has carried a decision out it tells the state so through `loaded` (a span it loaded) and
`announced` (a span it now serves), as membership's driver tells its protocol.

A round with no move in progress plans: the members' recent paces are remembered and steadied
(`policy.steady`), the threshold a gain must pass is the largest of the configured one,
twice the paces' noise and what the last re-plan fell short of its promise once carried out
(`policy.missed_gain`), and the plan decides this node's span. Moving to it waits out the
cool-down and must pass the threshold (raised by the time the move's weights take to fetch),
except for a first span, a pinned one, or a move that serves layers no live member serves
(`policy.fills_a_hole`: requests wait on it).

A move is make-before-break. `Load` starts it; once the span is loaded, the rounds hand off:
the node keeps announcing the layers it gives up until members the plan keeps on them
announce them (`policy.not_taken`: another member giving them up too announces them only
until its own handoff ends), or until placement.handoff_timeout_s when they never do (two
nodes swapping spans wait on each other). When those members wait on no handoff of their
own, or on a chain of takers that ends in a member that waits on no one
(`policy.handoff_is_one_way`), it waits as long as they take to load, up to PATIENT_HANDOFFS
timeouts: a slow machine loading its new layers must not open a gap. So the moves of one
re-plan order themselves: nodes that only add layers announce at once, and the
ones that drop layers follow as their successors appear. `Announce` ends it; the old shard then
stays for the sessions it holds and is released once none uses it and others serve its layers
(`may_release`). `CallOff` ends it the other way: a member the plan gives the layers to says it
leaves, so nobody will take them; the node keeps serving what it serves and drops the loaded
span, and the next round plans without the leaving member. (Waited out, the move would give
the layers up to nobody: a hole until a re-plan after the timeout loads them again.)
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from swarm import placement
from swarm.config import PlacementConfig
from swarm.rebalancing import policy
from swarm.types import LayerSpan, MemberRecord, NodeId

PATIENT_HANDOFFS = 10  # handoff timeouts a node waits for takers that wait on no one


@dataclass(frozen=True)
class FetchCost:
    """What fetching layers from peers would take: the bytes this node's store lacks for each
    layer (empty: it holds them all, or has the model file) at the rate fetches reach."""

    missing_bytes: tuple[int, ...] = ()  # per layer; 0 for a layer stored here
    rate_bytes_per_s: float = 1.0

    def seconds_for(self, span: LayerSpan) -> float:
        missing = sum(self.missing_bytes[i] for i in span if i < len(self.missing_bytes))
        return missing / self.rate_bytes_per_s if missing else 0.0


@dataclass(frozen=True)
class Inputs:
    """One round's snapshot, gathered by the loop."""

    me: MemberRecord  # this node's record as it announces it now
    members: tuple[MemberRecord, ...]  # live members serving this model, as the view has them
    serving: LayerSpan | None  # what this node's current shard serves
    num_layers: int
    config: PlacementConfig
    now: float  # seconds on the loop's monotonic clock
    fetch: FetchCost = FetchCost()
    kept_positions: int = 0  # prompt positions this node keeps blocks of (the prompt cache)

    def recompute_s(self) -> float:
        """What a move costs in prompts computed again: every prefix kept is of no use once
        a hop of its route serves other layers (the layers a node gains start cold), so the
        conversations that come back compute their prompts whole again, through every layer,
        at this node's prefill pace."""
        ms = self.me.capacity.ms_per_layer_prefill
        if not self.kept_positions or not math.isfinite(ms) or ms <= 0:
            return 0.0
        return self.kept_positions * ms * self.num_layers / 1000.0


@dataclass(frozen=True)
class Handoff:
    """A move whose span is loaded, waiting to be announced."""

    target: LayerSpan
    plan: placement.Plan  # the plan the move carries out: who takes the layers given up
    dropped: tuple[int, ...]  # layers served now that the new span gives up
    started_at: float  # when the wait for their takers began
    waits: bool  # False for a first or a pinned span: nothing is given up to anyone
    patient: bool = False  # past the timeout, waiting for takers that wait on no one


@dataclass(frozen=True)
class RebalanceState:
    """What the loop carries from one round to the next; only `decide` and its transitions
    make new ones."""

    paces: Mapping[NodeId, tuple[float, ...]] = field(default_factory=dict)  # recent, ms/layer
    promise: policy.Move | None = None  # the last re-plan the swarm set out on, to check it
    missed: float = 0.0  # the most that promise fell short of its gain so far
    last_move_at: float = -math.inf  # when this node last announced a new span
    plan: placement.Plan | None = None  # the last plan computed, for /status
    handoff: Handoff | None = None  # a move loaded and not yet announced


class Reason(enum.Enum):
    DRAINING = "draining"  # leaving: the others plan without it and cover its layers
    UNPLACED = "unplaced"  # the plan gives this node no span
    IN_PLACE = "in_place"  # it serves its planned span already
    COOLING_DOWN = "cooling_down"  # it moved less than placement.cooldown_s ago
    UNDER_THRESHOLD = "under_threshold"  # the gain does not pass the threshold
    FIRST_SPAN = "first_span"  # it serves nothing yet
    PINNED = "pinned"  # its admin set its span
    FILLS_A_HOLE = "fills_a_hole"  # the plan serves layers no live member serves
    GAIN = "gain"  # the plan's bottleneck rises past the threshold
    TAKERS_LOADING = "takers_loading"  # waiting for the members taking its old layers
    HANDED_OFF = "handed_off"  # they announce them
    GAVE_UP = "gave_up"  # they did not within the timeout
    NOTHING_GIVEN_UP = "nothing_given_up"  # a first or pinned span: no one to wait for
    TAKER_LEAVING = "taker_leaving"  # a member taking its old layers leaves: the move is off


@dataclass(frozen=True)
class Stay:
    """Serve what it serves; `detail` says more for logs and /status."""

    reason: Reason
    detail: str = ""


@dataclass(frozen=True)
class Load:
    """Fetch and load `target` while the current shard keeps serving."""

    reason: Reason
    target: LayerSpan
    current: LayerSpan | None
    plan: placement.Plan
    records: tuple[MemberRecord, ...]  # the members planned on, at their steady paces
    bottleneck: float  # tokens/s the swarm runs now, at those paces
    threshold: float  # the gain the move had to pass (unless it skipped the test)


@dataclass(frozen=True)
class AwaitTakers:
    """Keep announcing the old span and look again soon."""

    reason: Reason
    waiting: tuple[LayerSpan, ...]  # layers no member the plan keeps on them announces yet
    newly_patient: bool = False  # the timeout passed and the takers wait on no one


@dataclass(frozen=True)
class Announce:
    """Serve and announce the loaded span. `settle`: the takers announce the layers given up;
    let their records reach every entry first."""

    reason: Reason
    target: LayerSpan
    settle: bool
    abandoned: tuple[LayerSpan, ...] = ()  # given up, and no member kept on them announces them
    waited_s: float = 0.0


@dataclass(frozen=True)
class CallOff:
    """Drop the loaded span `target` and keep serving the current one: `leaving` are members
    the move gave layers to that leave now."""

    reason: Reason
    target: LayerSpan
    leaving: tuple[NodeId, ...]


Decision: TypeAlias = Stay | Load | AwaitTakers | Announce | CallOff


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    state: RebalanceState


def describe(decision: Decision) -> str:
    """One line for logs and PlanReport.decision."""
    kind = type(decision).__name__.lower()
    if isinstance(decision, Stay):
        detail = f" ({decision.detail})" if decision.detail else ""
        return f"{kind}: {decision.reason.value}{detail}"
    if isinstance(decision, AwaitTakers):
        return f"{kind}: {', '.join(str(s) for s in decision.waiting)}"
    return f"{kind} {decision.target}: {decision.reason.value}"


def decide(state: RebalanceState, inputs: Inputs) -> Outcome:
    """The next step: hand off the move in progress, or plan."""
    if state.handoff is not None:
        return _hand_off(state, state.handoff, inputs)
    return _plan(state, inputs)


def loaded(state: RebalanceState, move: Load, now: float) -> RebalanceState:
    """The span of `move` is loaded at `now`: the handoff starts."""
    current = move.current
    dropped = () if current is None else tuple(i for i in current if i not in move.target)
    # a pinned node never waits: its admin set where it serves
    waits = current is not None and move.reason is not Reason.PINNED
    handoff = Handoff(move.target, move.plan, dropped, now, waits)
    return dataclasses.replace(state, handoff=handoff)


def announced(state: RebalanceState, now: float) -> RebalanceState:
    """The loaded span is served and announced at `now`; the cool-down starts."""
    return dataclasses.replace(state, handoff=None, last_move_at=now)


def pinned_span(num_layers: int, span: str) -> LayerSpan | None:
    """The span placement.span sets (checked against the model), None for automatic."""
    if not span:
        return None
    pinned = LayerSpan.parse(span)
    pinned.check_within(num_layers)  # SpanError
    return pinned


def may_release(span: LayerSpan, members: Sequence[MemberRecord], me: NodeId) -> bool:
    """Whether a retiring shard's layer `span` beyond the current one may go: a staying member
    other than this node serves it. A node alone keeps it (nobody would serve it after)."""
    return placement.covered_by_others(span, members, me, alone=False)


# --- planning -----------------------------------------------------------------------------------


def _plan(state: RebalanceState, inputs: Inputs) -> Outcome:
    me = inputs.me
    if me.draining:
        return Outcome(Stay(Reason.DRAINING), state)
    # a leaving node's layers are planned as gone, so the others cover them before it goes
    records = (*_others(inputs), me)
    paces = policy.remember_paces(state.paces, records)
    records, config = policy.steady(records, paces, inputs.config)
    running = placement.evaluate(records, inputs.num_layers)
    missed = state.missed
    if state.promise is not None:
        missed = max(missed, policy.missed_gain(state.promise, running, records) or 0.0)
    config = dataclasses.replace(
        config, rebalance_threshold=max(config.rebalance_threshold, missed)
    )
    proposed = placement.plan(records, inputs.num_layers, config)
    promise = state.promise
    if proposed.spans != running.spans and (
        promise is None or proposed.spans != promise.after.spans
    ):
        promise, missed = policy.Move.of(running, proposed), 0.0
    state = dataclasses.replace(state, paces=paces, promise=promise, missed=missed, plan=proposed)
    return Outcome(_choose(state, inputs, records, running, proposed, config), state)


def _others(inputs: Inputs) -> tuple[MemberRecord, ...]:
    """The members other than this node that stay."""
    me = inputs.me.node_id
    return tuple(r for r in inputs.members if r.node_id != me and not r.draining)


def _choose(
    state: RebalanceState,
    inputs: Inputs,
    records: tuple[MemberRecord, ...],
    running: placement.Plan,
    proposed: placement.Plan,
    config: PlacementConfig,
) -> Decision:
    """Whether to move to this node's span in `proposed` (`config`: its threshold)."""
    pinned = pinned_span(inputs.num_layers, inputs.config.span)
    target = pinned if pinned is not None else proposed.span_of(inputs.me.node_id)
    current = inputs.serving
    if target is None:
        return Stay(Reason.UNPLACED)
    threshold = config.rebalance_threshold
    if target == current:
        # placement.plan kept the spans: no plan beat them by the threshold
        return Stay(Reason.IN_PLACE, _threshold(threshold))

    def load(reason: Reason) -> Load:
        return Load(reason, target, current, proposed, records, running.bottleneck, threshold)

    if current is None:
        return load(Reason.FIRST_SPAN)
    if pinned is not None:
        return load(Reason.PINNED)
    if policy.fills_a_hole(running, proposed):
        return load(Reason.FILLS_A_HOLE)  # requests wait on it: no cool-down, no threshold
    since_s = inputs.now - state.last_move_at
    if since_s < inputs.config.cooldown_s:
        return Stay(Reason.COOLING_DOWN, f"{inputs.config.cooldown_s - since_s:.1f} s left")
    payback_s = inputs.config.transfer_payback_s
    transfer_s, recompute_s = inputs.fetch.seconds_for(target), inputs.recompute_s()
    if not policy.worth_moving(running, proposed, threshold, transfer_s + recompute_s, payback_s):
        gain = proposed.bottleneck / running.bottleneck if running.bottleneck > 0 else math.inf
        detail = (
            f"{target} gains {gain:.2f}x; {_threshold(threshold)}, {transfer_s:.0f} s to fetch,"
            f" {recompute_s:.0f} s of kept prompts to compute again"
        )
        return Stay(Reason.UNDER_THRESHOLD, detail)
    return load(Reason.GAIN)


def _threshold(threshold: float) -> str:
    if math.isinf(threshold):
        return "a member's noise is unknown: only covering or replicating more moves"
    return f"threshold {threshold:.0%}"


# --- handing off --------------------------------------------------------------------------------


def _hand_off(state: RebalanceState, handoff: Handoff, inputs: Inputs) -> Outcome:
    if not handoff.waits:
        return Outcome(Announce(Reason.NOTHING_GIVEN_UP, handoff.target, settle=False), state)
    me = inputs.me.node_id
    untaken = policy.not_taken(handoff.plan, inputs.members, me, handoff.dropped)
    waiting = tuple(LayerSpan(i, i + 1) for i in untaken)
    if not waiting:
        return Outcome(Announce(Reason.HANDED_OFF, handoff.target, settle=True), state)
    leaving = policy.leaving_takers(handoff.plan, inputs.members, me, handoff.dropped)
    if leaving:
        called_off = CallOff(Reason.TAKER_LEAVING, handoff.target, leaving)
        return Outcome(called_off, dataclasses.replace(state, handoff=None))
    waited_s = inputs.now - handoff.started_at
    timeout_s = inputs.config.handoff_timeout_s
    if waited_s < timeout_s:
        return Outcome(AwaitTakers(Reason.TAKERS_LOADING, waiting), state)
    one_way = policy.handoff_is_one_way(handoff.plan, inputs.members, me, handoff.dropped)
    if not one_way or waited_s >= PATIENT_HANDOFFS * timeout_s:
        gave_up = Announce(Reason.GAVE_UP, handoff.target, False, waiting, waited_s)
        return Outcome(gave_up, state)
    newly_patient = not handoff.patient
    state = dataclasses.replace(state, handoff=dataclasses.replace(handoff, patient=True))
    return Outcome(AwaitTakers(Reason.TAKERS_LOADING, waiting, newly_patient), state)
