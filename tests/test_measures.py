"""Metrics declared on the status records: `families` reads them off a record and the records
inside it, `summed` adds records of counters up, and /metrics shows the node's load under the
names users scrape."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated, Any

import pytest

from harness.factories import member
from swarm.api.metrics import ApiMetrics
from swarm.measures import Family, counter, families, gauge, summed
from swarm.membership.subsystem import member_row
from swarm.schema import (
    Coverage,
    EntryLoad,
    HopLoad,
    MemberRow,
    ModelInfo,
    NodeInfo,
    NodeLoad,
    NodeStatus,
    PromptCacheLoad,
    SpeculationReport,
    SpotCheckReport,
    TransferReport,
)
from swarm.types import Health

_CALLS = counter("calls", "Calls by part", "part")


@dataclass(frozen=True)
class Part:
    calls: Annotated[int, _CALLS.at("a")] = 0
    held: Annotated[int, gauge("held", "Held now")] = 0
    note: str = ""  # no metric


@dataclass(frozen=True)
class Other:
    calls: Annotated[int, _CALLS.at("b")] = 0


@dataclass(frozen=True)
class Whole:
    part: Part = Part()
    other: Other = Other()
    maybe: Part | None = None  # None: no samples, no family
    peers: Annotated[tuple[str, ...], gauge("peers", "Peers")] = ()
    skew_ms: Annotated[dict[str, float], gauge("skew_seconds", "Skew", "node", 1e-3)] = field(
        default_factory=dict
    )
    on: Annotated[bool, gauge("on", "1 while on")] = False
    rate: Annotated[float | None, gauge("rate", "A rate when known")] = None


@dataclass(frozen=True)
class Clash:
    one: Annotated[int, counter("x", "One")] = 0
    two: Annotated[int, gauge("x", "One")] = 0


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (
            Part(3, 4, "n"),  # only the declared fields show
            [
                Family("calls", "Calls by part", "counter", "part", (("a", 3.0),)),
                Family("held", "Held now", "gauge", None, ((None, 4.0),)),
            ],
        ),
        (
            Whole(Part(1, 2), Other(5), None, ("p", "q"), {"n1": 250.0}, True, 1.5),
            [
                Family("calls", "Calls by part", "counter", "part", (("a", 1.0), ("b", 5.0))),
                Family("held", "Held now", "gauge", None, ((None, 2.0),)),
                Family("peers", "Peers", "gauge", None, ((None, 2.0),)),
                Family("skew_seconds", "Skew", "gauge", "node", (("n1", 0.25),)),
                Family("on", "1 while on", "gauge", None, ((None, 1.0),)),
                Family("rate", "A rate when known", "gauge", None, ((None, 1.5),)),
            ],
        ),
        (
            Whole(skew_ms={}),  # an empty dict still shows its family, a None value does not
            [
                Family("calls", "Calls by part", "counter", "part", (("a", 0.0), ("b", 0.0))),
                Family("held", "Held now", "gauge", None, ((None, 0.0),)),
                Family("peers", "Peers", "gauge", None, ((None, 0.0),)),
                Family("skew_seconds", "Skew", "gauge", "node", ()),
                Family("on", "1 while on", "gauge", None, ((None, 0.0),)),
                Family("rate", "A rate when known", "gauge", None, ()),
            ],
        ),
    ],
)
def test_families_are_read_off_the_records_in_declared_order(
    record: object, expected: list[Family]
) -> None:
    assert list(families(record)) == expected


def test_one_name_declared_two_ways_is_refused() -> None:
    with pytest.raises(TypeError, match="the metric x is declared two different ways"):
        families(Clash())


@pytest.mark.parametrize(
    ("kind", "records", "expected"),
    [
        (HopLoad, [], HopLoad()),
        (
            HopLoad,
            [HopLoad(kv_sessions=1, kv_used_bytes=10), HopLoad(batches=2, batched_steps=5)],
            HopLoad(kv_sessions=1, kv_used_bytes=10, batches=2, batched_steps=5),
        ),
        (
            PromptCacheLoad,
            [PromptCacheLoad(1, 2, 3, 4, 5, 6), PromptCacheLoad(10, 20, 30, 40, 50, 60)],
            PromptCacheLoad(11, 22, 33, 44, 55, 66),
        ),
        (EntryLoad, [EntryLoad(1, 2, 3, 4, 5)], EntryLoad(1, 2, 3, 4, 5)),
    ],
)
def test_summed_adds_each_field(kind: type[Any], records: list[Any], expected: Any) -> None:
    assert summed(kind, records) == expected


def test_summed_refuses_a_record_that_is_not_all_numbers() -> None:
    with pytest.raises(TypeError, match=r"Part\.note is not a number to add up"):
        summed(Part, [Part()])


LOAD = NodeLoad(
    5,
    EntryLoad(1, 8, 9, 11, 12, 19, 2, 1),
    HopLoad(2, 3, 4, 6, 7, 10, 21, 22),
    PromptCacheLoad(13, 14, 15, 16, 17, 18),
)
STATUS = NodeStatus(
    node=NodeInfo("a", "x", (0, 4), LOAD),
    model=ModelInfo("tiny", "m", 30),
    members=(),
    coverage=Coverage(True, (), 17, 3.0),
    refusals={"bad_frame": 3},
    clock_skew_ms={"p": 250.0},
    transfer=TransferReport(True, 1, 2, 300, 400, 5.5, "x", ("s",), ("b1", "b2"), 600),
    speculation=SpeculationReport(10, 20, 15, 1.5, 2, "d", 7, 6),
    spot_checks=SpotCheckReport({"b": 1}, ("b",), {"b": 1}),
)


@pytest.mark.parametrize(
    "sample",
    [
        "swarm_entry_sessions 1.0",
        'swarm_batched_calls_total{part="head"} 8.0',
        'swarm_batched_steps_total{part="head"} 9.0',
        "swarm_head_thread_steps_total 11.0",
        "swarm_steps_sent_ahead_total 12.0",
        "swarm_spot_checks_total 19.0",
        "swarm_spot_check_mismatches_total 2.0",
        "swarm_spot_checks_undecided_total 1.0",
        'swarm_wrong_results_total{node="b"} 1.0',
        "swarm_kv_sessions 2.0",
        "swarm_kv_cache_used_bytes 3.0",
        "swarm_kv_cache_budget_bytes 4.0",
        'swarm_batched_calls_total{part="hop"} 6.0',
        'swarm_batched_steps_total{part="hop"} 7.0',
        "swarm_hop_thread_steps_total 10.0",
        "swarm_layer_reloads_total 21.0",
        "swarm_layer_reloads_refused_total 22.0",
        'swarm_reloads_asked_total{node="b"} 1.0',
        "swarm_prompt_cache_blocks 13.0",
        "swarm_prompt_cache_bytes 14.0",
        'swarm_prompt_cache_block_events_total{event="adopted"} 15.0',
        'swarm_prompt_cache_block_events_total{event="missing"} 16.0',
        'swarm_prompt_cache_block_events_total{event="kept"} 17.0',
        'swarm_prompt_cache_block_events_total{event="evicted"} 18.0',
        "swarm_layers 30.0",
        "swarm_layers_covered 17.0",
        'swarm_refusals_total{reason="bad_frame"} 3.0',
        'swarm_peer_clock_skew_seconds{node="p"} 0.25',
        "swarm_transfer_active 1.0",
        "swarm_transfer_received_bytes 300.0",
        "swarm_transfer_wanted_bytes 400.0",
        "swarm_transfer_bytes_per_second 5.5",
        "swarm_transfer_bad_peers 2.0",
        "swarm_transfer_sent_bytes 600.0",
        "swarm_speculative_verify_steps_total 10.0",
        "swarm_speculative_drafted_tokens_total 20.0",
        "swarm_speculative_accepted_tokens_total 15.0",
        "swarm_speculative_mean_accepted 1.5",
        "swarm_speculative_model_drafted_tokens_total 7.0",
        "swarm_speculative_model_accepted_tokens_total 6.0",
        'swarm_members{state="alive"} 0.0',
    ],
)
def test_metrics_show_the_status_under_the_names_users_scrape(sample: str) -> None:
    lines = ApiMetrics(lambda: STATUS).render().decode().splitlines()
    assert sample in lines


def test_every_metric_of_the_status_has_one_help_and_one_type() -> None:
    text = ApiMetrics(lambda: replace(STATUS, refusals={})).render().decode()
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP swarm_")]
    assert len(helps) == len(set(helps))
    assert "swarm_refusals_total" in helps  # with no refusals yet, still described


def _gpu_row(name: str, health: Health) -> MemberRow:
    """The status row of member `name` whose GPU reads `health`."""
    return member_row(replace(member(name, (0, 4)), health=health), "alive", None)


HOT = Health(
    gpu_temperature_c=91.0,
    gpu_utilization=0.75,
    gpu_memory_used_bytes=9,
    gpu_memory_total_bytes=24,
    gpu_power_w=212.5,
)


@pytest.mark.parametrize(
    "sample",
    [
        'swarm_gpu_temperature_celsius{node="g"} 91.0',
        'swarm_gpu_memory_used_bytes{node="g"} 9.0',
        'swarm_gpu_utilization_ratio{node="g"} 0.75',
        'swarm_gpu_power_watts{node="g"} 212.5',
        'swarm_gpu_throttling{node="g"} 1.0',
        'swarm_gpu_throttling{node="c"} 0.0',
    ],
)
def test_metrics_show_each_members_gpu(sample: str) -> None:
    members = (_gpu_row("g", HOT), _gpu_row("c", replace(HOT, gpu_temperature_c=60.0)))
    status = replace(STATUS, members=(*members, _gpu_row("n", Health())))  # n: no GPU
    lines = ApiMetrics(lambda: status).render().decode().splitlines()
    assert sample in lines
    assert not any('node="n"' in line and "swarm_gpu_" in line for line in lines)
