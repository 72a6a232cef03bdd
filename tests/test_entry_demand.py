"""An entry's head and sampling weigh in placement: the demand each node counts, how it
travels in gossip, and the plans it leads to."""

from __future__ import annotations

import dataclasses

import pytest

from swarm import placement
from swarm.config import PlacementConfig
from swarm.errors import FrameError
from swarm.membership.wire_format import record_from_wire, record_to_wire
from swarm.telemetry import EntryDemand
from swarm.types import Capacity, LayerSpan, Load, MemberRecord, ModelId, NodeId
from swarm.wire.fields import Fields

HOUR = 3600.0


def member(
    node_id: str,
    ms: float,
    head: float = 8.0,
    tokens: float = 0.0,
    hour: int = 0,
    span: tuple[int, int] | None = None,
) -> MemberRecord:
    """A node at `ms` per layer per token, memory for 20 of the model's 30 layers (so the
    model is split), whose head costs `head` of its layers and which sampled `tokens` as an
    entry, counted up to `hour`."""
    return MemberRecord(
        node_id=NodeId(node_id),
        address=f"{node_id}.lan:7000",
        incarnation=1,
        model_id=ModelId("m"),
        num_layers=30,
        capacity=Capacity("cpu", "float32", 20_000, 1000, ms * 4, ms, head_layers=head),
        span=None if span is None else LayerSpan(*span),
        load=Load(entry_tokens=tokens, entry_hour=hour),
    )


def spans(plan: placement.Plan) -> dict[str, tuple[int, int] | None]:
    return {node: None if s is None else (s.start, s.end) for node, s in plan.spans}


def lengths(plan: placement.Plan) -> dict[str, int]:
    return {node: 0 if s is None else len(s) for node, s in plan.spans}


# --- the plans ----------------------------------------------------------------------------------


def test_without_entry_tokens_the_head_changes_nothing() -> None:
    plain = [member("a", 3.0, head=0.0), member("b", 3.0, head=0.0), member("c", 1.0, head=0.0)]
    heads = [member("a", 3.0), member("b", 3.0), member("c", 1.0)]
    assert spans(placement.optimal_plan(heads, 30)) == spans(placement.optimal_plan(plain, 30))


def test_a_slow_entry_gives_layers_to_the_others() -> None:
    """Shares 1:1:3, the client on a slow node whose head costs 8 of its layers (the
    embedded model's lm_head is 8 layers' worth of weights). Blind to the head, the plan is the
    fast node on 18 layers and both slow ones on the other 12 as replicas, where the entry's
    head makes its replica the bottleneck. Counting it, the fast node takes 20."""
    records = [member("a", 3.0, tokens=500.0), member("b", 3.0), member("c", 1.0)]
    ignoring = placement.optimal_plan([member("a", 3.0), member("b", 3.0), member("c", 1.0)], 30)
    counting = placement.optimal_plan(records, 30)
    assert spans(ignoring) == {"a": (18, 30), "b": (18, 30), "c": (0, 18)}
    assert spans(counting) == {"a": (20, 30), "b": (20, 30), "c": (0, 20)}
    # scored with the entry's head, the head-blind plan is the worse one
    blind = placement.score(records, dict(ignoring.spans), 30).bottleneck
    assert blind == pytest.approx(1000 / 3 / (12 + 8) + 1000 / 3 / 12)
    assert counting.bottleneck == pytest.approx(1000 / 20)  # the fast node's stage, now
    assert counting.bottleneck > 1.1 * blind


def test_a_slow_entry_on_a_chain_keeps_fewest_layers() -> None:
    """Memory for 12 layers on each slow node and 14 on the fast one forces a chain of three:
    the entry's stage is 8 layers shorter than the other slow node's."""
    records = [
        dataclasses.replace(r, capacity=dataclasses.replace(r.capacity, layer_memory_bytes=cap))
        for r, cap in (
            (member("a", 3.0, tokens=500.0), 12_000),
            (member("b", 3.0), 12_000),
            (member("c", 1.0), 14_000),
        )
    ]
    assert lengths(placement.optimal_plan(records, 30)) == {"a": 4, "b": 12, "c": 14}


def test_a_fast_entry_keeps_fewer_layers_than_its_speed_alone_would_give() -> None:
    records = [member("a", 3.0), member("b", 3.0), member("c", 1.0, tokens=500.0)]
    ignoring = placement.optimal_plan([member("a", 3.0), member("b", 3.0), member("c", 1.0)], 30)
    counting = placement.optimal_plan(records, 30)
    assert lengths(counting)["c"] < lengths(ignoring)["c"]
    assert lengths(counting)["a"] > 0 and lengths(counting)["b"] > 0
    # c holds k layers at 1000 / (k + 8) tokens/s: the bottleneck counts its head
    k = lengths(counting)["c"]
    assert counting.bottleneck <= 1000 / (k + 8) + 1e-9


def test_shares_are_ratios_so_the_plan_holds_while_counts_grow_or_halve() -> None:
    def records(scale: float, hour: int) -> list[MemberRecord]:
        return [
            member("a", 3.0, tokens=300 * scale, hour=hour),
            member("b", 3.0, tokens=100 * scale, hour=hour),
            member("c", 1.0),
        ]

    first = spans(placement.optimal_plan(records(1.0, 5), 30))
    assert spans(placement.optimal_plan(records(10.0, 5), 30)) == first
    assert spans(placement.optimal_plan(records(0.5, 6), 30)) == first


def test_a_count_from_an_older_hour_is_halved_for_each_hour_behind() -> None:
    shares = placement.entry_shares(
        [
            member("a", 1.0, tokens=200.0, hour=10),  # not yet republished since hour 11
            member("b", 1.0, tokens=100.0, hour=11),
            member("c", 1.0),
        ]
    )
    assert shares == {"a": pytest.approx(0.5), "b": pytest.approx(0.5)}


def test_a_running_plan_blind_to_the_head_is_worth_leaving() -> None:
    """The keep-or-move decision: an even split whose slow node became the entry of all
    traffic moves, past a 15% threshold."""
    running = [
        member("a", 3.0, tokens=500.0, span=(0, 10)),
        member("b", 3.0, span=(10, 20)),
        member("c", 1.0, span=(20, 30)),
    ]
    proposed = placement.plan(running, 30, PlacementConfig(rebalance_threshold=0.15))
    assert lengths(proposed) == {"a": 10, "b": 10, "c": 20}
    assert proposed.span_of(NodeId("a")) == proposed.span_of(NodeId("b"))  # replicas


# --- counting and announcing ---------------------------------------------------------------------


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_entry_demand_halves_at_every_hour_of_the_wall_clock() -> None:
    clock = Clock(100 * HOUR + 10)
    demand = EntryDemand(clock)
    demand.record(64)
    assert demand.now() == (64.0, 100)
    clock.now = 100 * HOUR + 3599  # same hour: no decay, however long ago
    demand.record(16)
    assert demand.now() == (80.0, 100)
    clock.now = 103 * HOUR + 1  # three hours on
    assert demand.now() == (10.0, 103)


def test_demand_and_head_travel_in_the_member_record() -> None:
    sent = member("a", 2.0, head=7.5, tokens=123.5, hour=491_000, span=(0, 10))
    assert record_from_wire(Fields(record_to_wire(sent), "record")) == sent


def test_a_record_without_them_reads_as_no_entry_work() -> None:
    wire = record_to_wire(member("a", 2.0, tokens=5.0))
    del wire["cap"]["head"]  # type: ignore[index]
    del wire["load"]["entry"]  # type: ignore[index]
    got = record_from_wire(Fields(wire, "record"))
    assert got.capacity.head_layers == 0.0
    assert (got.load.entry_tokens, got.load.entry_hour) == (0.0, 0)


@pytest.mark.parametrize(
    "entry", [[1], [1, -2.0], ["1", 2.0], [1, float("inf")], [1.5, 2.0], [1, 2, 3]]
)
def test_a_malformed_entry_demand_is_refused(entry: list) -> None:  # type: ignore[type-arg]
    wire = record_to_wire(member("a", 2.0))
    wire["load"]["entry"] = entry  # type: ignore[index]
    with pytest.raises(FrameError, match="entry"):
        record_from_wire(Fields(wire, "record"))


def test_a_negative_head_is_refused() -> None:
    record = member("a", 2.0)
    wire = record_to_wire(
        dataclasses.replace(record, capacity=dataclasses.replace(record.capacity, head_layers=-1))
    )
    with pytest.raises(FrameError, match="head"):
        record_from_wire(Fields(wire, "record"))
