"""What GET /status, the dashboard and `swarm status` show: this node and its load, the member
table, layer coverage and the plan."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import psutil

from swarm import placement
from swarm.types import LayerSpan, MemberRecord

if TYPE_CHECKING:
    from swarm.node import Node


def _span(span: LayerSpan | None) -> list[int] | None:
    return None if span is None else [span.start, span.end]


def member_row(record: MemberRecord, state: str) -> dict[str, Any]:
    c, h = record.capacity, record.health
    return {
        "id": record.node_id,
        "address": record.address,
        "state": state,
        "span": _span(record.span),
        "ms_per_layer_decode": round(c.ms_per_layer_decode * record.slowdown, 4),
        "ms_per_layer_prefill": round(c.ms_per_layer_prefill * record.slowdown, 4),
        "slowdown": record.slowdown,
        "layer_memory_bytes": c.layer_memory_bytes,
        "bytes_per_layer": c.bytes_per_layer,
        "max_layers": c.max_layers(),
        "device": c.device,
        "dtype": c.dtype,
        "active_sessions": record.load.active_sessions,
        "queue_depth": record.load.queue_depth,
        "kv_free_bytes": record.load.kv_free_bytes,
        **dataclasses.asdict(h),
        "model_id": record.model_id,
    }


def node_load(node: Node) -> dict[str, Any]:
    """This node's own load, read now (not from gossip)."""
    sessions, used = 0, 0
    budget = 0
    for shard in node.serving.all():
        held, nbytes = shard.kv.snapshot()
        sessions, used, budget = sessions + held, used + nbytes, budget + shard.kv.budget_bytes
    return {
        "sessions_in_flight": len(node.pipeline.traces),  # requests this node is the entry of
        "kv_sessions": sessions,  # sessions whose caches this node holds for its layers
        "kv_used_bytes": used,
        "kv_budget_bytes": budget,
        "rss_bytes": psutil.Process().memory_info().rss,
    }


def node_status(node: Node) -> dict[str, Any]:
    view = node.gossiper.view
    me = node.gossiper.local
    rtt = node.round_trips.snapshot()
    members = [
        {**member_row(entry.record, entry.state.value), "rtt_ms": _ms(rtt.get(entry.node_id))}
        for entry in view
        if entry.record is not None
    ]
    routable = view.routable_members(me.model_id)
    current = placement.evaluate(routable, node.context.num_layers)
    plan = node.rebalancer.plan
    return {
        "node": {
            "id": me.node_id,
            "address": me.address,
            "span": _span(me.span),
            "load": node_load(node),
        },
        "model": {
            "name": node.config.runtime.model,
            "id": me.model_id,
            "layers": node.context.num_layers,
        },
        "members": sorted(members, key=lambda m: m["id"]),
        "sessions": [
            {"id": session, "route": [hop.node_id for hop in trace.route.hops]}
            for session, trace in list(node.pipeline.traces.items())
        ],
        "coverage": {
            "complete": not current.missing,
            "missing": [[s.start, s.end] for s in current.missing],
            "covered_layers": current.covered,
            "bottleneck_tokens_per_s": round(current.bottleneck, 3),
        },
        "plan": None
        if plan is None
        else {
            "spans": {node_id: _span(span) for node_id, span in plan.spans},
            "bottleneck_tokens_per_s": round(plan.bottleneck, 3),
            "hops": plan.hops,
        },
    }


def _ms(value: float | None) -> float | None:
    """A measured round trip as this node's status shows it; None when never measured."""
    return None if value is None else round(value, 3)
