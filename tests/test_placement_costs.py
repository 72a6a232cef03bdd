"""Placement with each node's fixed cost per step: a stage runs a token in its node's fixed
cost plus its layers' pace, so a stage added for a few layers costs a whole step's fixed part,
and the plan fills a fast node's memory rather than add a slow stage where that pays."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.factories import member, plan_spans
from swarm.membership.wire_format import record_from_wire, record_to_wire
from swarm.placement import evaluate, optimal_plan, predicted_rate
from swarm.rebalancing.housekeeping import RecordRefresher
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.serving import Serving
from swarm.runtime.gpu.device import HostAccelerator
from swarm.telemetry import SpeedMeter, StepCost
from swarm.types import MemberRecord
from swarm.wire.fields import Fields


@dataclass(frozen=True)
class Case:
    name: str
    members: list[MemberRecord]
    spans: dict[str, tuple[int, int] | None]
    bottleneck: float  # tokens/s with many streams
    latency_ms: float  # one token through the fastest route


def trio(fast_fixed: float, slow_fixed: float) -> list[MemberRecord]:
    """A node 3x faster whose memory holds 20 of the 30 layers, and two slow nodes."""
    return [
        member("fast", ms=0.13, layers=20, fixed_ms=fast_fixed),
        member("slow-1", ms=0.39, layers=20, fixed_ms=slow_fixed),
        member("slow-2", ms=0.39, layers=20, fixed_ms=slow_fixed),
    ]


CASES = [
    Case(
        "without fixed costs the slow replicas take 12 layers, the fast node 18 of its 20",
        trio(0.0, 0.0),
        {"fast": (0, 18), "slow-1": (18, 30), "slow-2": (18, 30)},
        1000 / (18 * 0.13),
        18 * 0.13 + 12 * 0.39,
    ),
    Case(
        "with them the fast node fills its memory: each slow step's fixed part is 3x its own",
        trio(1.5, 4.5),
        {"fast": (0, 20), "slow-1": (20, 30), "slow-2": (20, 30)},
        2000 / (4.5 + 10 * 0.39),  # the slow stage, 2.4% below the fast one's 1000 / 4.1
        1.5 + 20 * 0.13 + 4.5 + 10 * 0.39,
    ),
    Case(
        "the same fixed cost everywhere weighs most on the fast node's short step",
        trio(1.0, 1.0),
        {"fast": (0, 17), "slow-1": (17, 30), "slow-2": (17, 30)},
        1000 / (1.0 + 17 * 0.13),
        1.0 + 17 * 0.13 + 1.0 + 13 * 0.39,
    ),
    Case(
        "a slow stage whose fixed cost outweighs the layers it takes is not added",
        [member("fast", ms=1 / 3, layers=30, fixed_ms=1.0), member("slow", layers=10, fixed_ms=10)],
        {"fast": (0, 30), "slow": None},
        1000 / 11,
        11.0,
    ),
    Case(
        "copies of the whole model each pay their fixed cost once per token",
        [member("a", fixed_ms=2.0), member("b", fixed_ms=4.0)],
        {"a": (0, 30), "b": (0, 30)},
        1000 / 32 + 1000 / 34,
        32.0,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_stage_pays_its_nodes_fixed_cost(case: Case) -> None:
    got = optimal_plan(case.members, 30)
    assert plan_spans(got) == case.spans
    assert got.bottleneck == pytest.approx(case.bottleneck)
    assert got.latency_ms == pytest.approx(case.latency_ms)


@pytest.mark.parametrize(
    ("streams", "rate"),
    [
        (1, 1000 / (1.5 + 20 * 0.13 + 4.5 + 10 * 0.39)),  # one token in flight: the route's time
        (2, 2000 / (1.5 + 20 * 0.13 + 4.5 + 10 * 0.39)),
        (8, 2000 / (4.5 + 10 * 0.39)),  # enough to keep the slow stage busy: its rate
        (64, 2000 / (4.5 + 10 * 0.39)),
        (0, 0.0),
    ],
)
def test_a_lone_stream_gets_the_routes_time_and_many_the_bottleneck(
    streams: int, rate: float
) -> None:
    got = optimal_plan(trio(1.5, 4.5), 30)
    assert predicted_rate(got.bottleneck, got.latency_ms, streams) == pytest.approx(rate)


def test_the_fastest_route_through_replicas_is_timed() -> None:
    # a: 0:30 slow, b and c split it fast: the route through b and c pays two fixed costs
    got = evaluate(
        [
            member("a", (0, 30), fixed_ms=1.0),
            member("b", (0, 15), ms=0.5, fixed_ms=1.0),
            member("c", (15, 30), ms=0.5, fixed_ms=1.0),
        ],
        30,
    )
    assert got.latency_ms == pytest.approx(2 * (1.0 + 15 * 0.5))
    assert got.hops == 1  # fewest hops is another route than the fastest
    missing = evaluate([member("a", (0, 10), fixed_ms=1.0)], 30)
    assert missing.latency_ms is None
    assert predicted_rate(missing.bottleneck, missing.latency_ms, 8) == 0.0


def test_the_fixed_cost_travels_in_the_record_and_an_unsaid_one_is_zero() -> None:
    sent = member("a", fixed_ms=1.25)
    assert record_from_wire(Fields(record_to_wire(sent), "record")) == sent
    fields = record_to_wire(sent)
    capacity = fields["cap"]
    assert isinstance(capacity, dict)
    del capacity["fixed_ms"]  # a record from a node that predates the field
    assert record_from_wire(Fields(fields, "record")).capacity.ms_per_step_fixed == 0.0


def test_the_meter_starts_at_the_probed_fixed_part_and_learns_from_real_steps() -> None:
    meter = SpeedMeter(0.5, StepCost(step_ms=0.3, layer_ms=0.0, row_ms=0.13))
    assert meter.fixed_ms == pytest.approx(0.3)
    for _ in range(60):  # each step's frame took 1.2 ms at the hop
        meter.record_frame(1.2)
    assert meter.fixed_ms == pytest.approx(0.3 + 1.2, rel=1e-3)
    cost = meter.cost
    for _ in range(60):  # capped to a third of a core: the call's fixed part slows too
        meter.record_decode(10, 1, 3 * cost.expected_ms(10, 1))
    assert meter.fixed_ms == pytest.approx(3 * 0.3 + 1.2, rel=1e-3)


async def test_a_node_announces_its_fixed_cost_when_it_drifts() -> None:
    compute = ComputeThread(1, 4)
    try:
        # a row costs as much in a batch as alone, as the record's default row share says
        meter = SpeedMeter(4.0, StepCost(step_ms=0.3, layer_ms=0.0, row_ms=1.0))
        refresher = RecordRefresher(meter, Serving(), compute, HostAccelerator())
        updated = await compute.run(refresher.refreshed, member("me"))
        assert updated is not None
        assert updated.capacity.ms_per_step_fixed == pytest.approx(0.3)
        assert await compute.run(refresher.refreshed, updated) is None  # nothing drifted
        meter.record_frame(1.0)  # frames now cost 0.2 ms more (a moving average's first step)
        again = await compute.run(refresher.refreshed, updated)
        assert again is not None
        assert again.capacity.ms_per_step_fixed == pytest.approx(0.5)
    finally:
        compute.close()
