"""The status and trace records and their JSON: a round trip keeps every field, a reader
ignores what it does not know and defaults what is missing, and a bad field is named."""

from __future__ import annotations

import json

import pytest

from swarm.errors import StatusFormatError
from swarm.schema import (
    ApiReport,
    Coverage,
    EntryLoad,
    FailoverReport,
    HopLoad,
    HopTimes,
    MemberRow,
    ModelInfo,
    NodeInfo,
    NodeLoad,
    NodeStatus,
    PlanReport,
    RequestRecord,
    RequestTrace,
    RouteHop,
    SessionRow,
    from_json,
    to_json,
)

ROW = MemberRow(
    id="a",
    address="10.0.0.1:7420",
    state="alive",
    span=(0, 15),
    ms_per_layer_decode=1.5,
    ms_per_layer_prefill=0.25,
    layer_memory_bytes=10**9,
    bytes_per_layer=10**6,
    max_layers=1000,
    device="cpu",
    dtype="float32",
    active_sessions=2,
    queue_depth=1,
    kv_free_bytes=123,
    gpu_temperature_c=None,
    gpu_utilization=0.5,
    gpu_memory_used_bytes=None,
    gpu_memory_total_bytes=8,
    model_id="m",
    rtt_ms=0.25,
)
HOPS = (RouteHop("a", "10.0.0.1:7420", (0, 15)), RouteHop("b", "10.0.0.2:7420", (15, 30)))
TIMES = (HopTimes("a", 0.1, 2.0, 0.01), HopTimes("b", 0.2, 3.0, 0.02))
STATUS = NodeStatus(
    node=NodeInfo("a", "10.0.0.1:7420", (0, 15), NodeLoad(5, EntryLoad(1), HopLoad(2, 3, 4))),
    model=ModelInfo("tiny", "m", 30),
    members=(ROW, ROW.__class__(**{**ROW.__dict__, "id": "b", "span": None, "rtt_ms": None})),
    coverage=Coverage(False, ((15, 30),), 15, 66.5),
    sessions=(SessionRow("s1", ("a", "b")),),
    plan=PlanReport({"a": (0, 15), "b": None}, 66.5, 2),
    api=ApiReport(0, 4, True),
    recent_requests=(
        RequestRecord("cmpl-1", "chat", True, "stop", 1.5, 20.0, None, 3, 4, HOPS, TIMES),
    ),
)


def test_a_status_survives_json_both_ways() -> None:
    text = json.dumps(to_json(STATUS))
    assert from_json(NodeStatus, json.loads(text)) == STATUS


def test_the_json_keeps_the_names_clients_read() -> None:
    data = to_json(STATUS)
    assert data["node"]["load"]["hop"]["kv_budget_bytes"] == 4
    assert data["members"][0]["span"] == [0, 15] and data["members"][1]["span"] is None
    assert data["coverage"]["missing"] == [[15, 30]]
    assert data["plan"]["spans"] == {"a": [0, 15], "b": None}
    assert data["recent_requests"][0]["route"][1] == {
        "node": "b",
        "address": "10.0.0.2:7420",
        "layers": [15, 30],
    }


def test_a_trace_survives_json_both_ways() -> None:
    trace = RequestTrace(HOPS, TIMES, (FailoverReport("b", "gone", 1.0, 5.0, None, 7),))
    assert from_json(RequestTrace, json.loads(json.dumps(to_json(trace)))) == trace


def test_unknown_keys_are_ignored_and_missing_optional_ones_defaulted() -> None:
    data = to_json(STATUS)
    data["from_a_newer_node"] = {"x": 1}
    data["members"][0]["unreachable"] = True
    del data["plan"], data["api"], data["recent_requests"], data["members"][0]["rtt_ms"]
    status = from_json(NodeStatus, data)
    assert status.plan is None and status.api is None and status.members[0].rtt_ms is None
    assert status.members[0].id == "a"


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda d: d["node"].pop("id"), "NodeStatus.node.id is missing"),
        (lambda d: d["members"][0].update(span=[1]), r"members\[0\].span must have 2 items"),
        (lambda d: d["coverage"].update(complete="yes"), "coverage.complete must be bool"),
        (lambda d: d.update(members={}), "members must be an array"),
        (lambda d: d["node"]["load"].update(rss_bytes=1.5), "rss_bytes must be int"),
        (lambda d: d["node"]["load"]["hop"].update(batches="2"), "load.hop.batches must be int"),
    ],
)
def test_a_field_that_does_not_fit_is_named(change, fragment: str) -> None:  # type: ignore[no-untyped-def]
    data = to_json(STATUS)
    change(data)
    with pytest.raises(StatusFormatError, match=fragment):
        from_json(NodeStatus, data)
