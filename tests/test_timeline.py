"""The decode timeline a session's trace carries: sums of the entry's stamps and each hop's
timings, per hop, and its JSON through the status schema."""

from __future__ import annotations

import pytest

from swarm.inference.timeline import TimelineSums
from swarm.schema import HopTimeline, HopTimes, RequestTrace, Timeline, from_json, to_json
from swarm.types import NodeId


def timing(node: str, scale: float) -> HopTimes:
    return HopTimes(
        NodeId(node), 1 * scale, 10 * scale, 0.1 * scale, 0.2 * scale, 0.3 * scale, 0.4 * scale
    )


def test_no_decode_step_is_no_timeline() -> None:
    sums = TimelineSums()
    sums.add_head(3.0)  # a head without a step (the prefill's) is not a timeline
    assert sums.report() is None


def test_steps_sum_per_hop_in_the_order_a_step_spends_them() -> None:
    sums = TimelineSums()
    sums.add_step((timing("a", 1), timing("b", 2)), step_ms=40.0, send_ms=0.5, resume_ms=0.1)
    sums.add_step((timing("a", 3),), step_ms=30.0, send_ms=0.5, resume_ms=0.3)  # rerouted
    sums.add_head(2.0)
    report = sums.report()
    assert report is not None
    assert (report.steps, report.step, report.send, report.head) == (2, 70.0, 1.0, 2.0)
    assert report.resume == pytest.approx(0.4)
    a, b = report.hops
    assert a == HopTimeline(
        "a",
        2,
        pytest.approx(0.4),
        pytest.approx(0.8),
        4.0,
        40.0,
        pytest.approx(1.2),
        pytest.approx(1.6),
    )
    assert (b.node, b.steps, b.compute) == ("b", 1, 20.0)


def test_a_head_run_as_its_result_arrived_is_taken_out_of_the_step() -> None:
    sums = TimelineSums()
    sums.add_step((timing("a", 1),), step_ms=40.0, send_ms=0.5, resume_ms=0.1)
    sums.add_head(3.0, within_step=True)  # sampled on the compute thread inside the step
    sums.add_step((timing("a", 1),), step_ms=30.0, send_ms=0.5, resume_ms=0.1)
    sums.add_head(2.0)  # the generation waited for it after the step
    report = sums.report()
    assert report is not None
    assert (report.step, report.head) == (67.0, 5.0)


def test_a_trace_with_its_timeline_reads_back_from_json() -> None:
    timeline = Timeline(3, 60.0, 1.5, 0.3, 6.0, (HopTimeline("a", 3, 0.3, 0.6, 3, 30, 0.9, 1.2),))
    trace = RequestTrace((), timeline=timeline)
    assert from_json(RequestTrace, to_json(trace)) == trace
    assert from_json(RequestTrace, {"route": []}).timeline is None  # an older node's trace
