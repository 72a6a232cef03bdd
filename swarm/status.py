"""What GET /status and `swarm status` show: this node, the member table, layer coverage."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swarm import placement
from swarm.types import MemberRecord

if TYPE_CHECKING:
    from swarm.node import Node


def member_row(record: MemberRecord, state: str) -> dict[str, Any]:
    c, h = record.capacity, record.health
    return {
        "id": record.node_id,
        "address": record.address,
        "state": state,
        "span": None if record.span is None else [record.span.start, record.span.end],
        "ms_per_layer_decode": round(c.ms_per_layer_decode * record.slowdown, 4),
        "ms_per_layer_prefill": round(c.ms_per_layer_prefill * record.slowdown, 4),
        "slowdown": record.slowdown,
        "layer_memory_bytes": c.layer_memory_bytes,
        "max_layers": c.max_layers(),
        "device": c.device,
        "dtype": c.dtype,
        "active_sessions": record.load.active_sessions,
        "queue_depth": record.load.queue_depth,
        "gpu_temperature_c": h.gpu_temperature_c,
        "model_id": record.model_id,
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
    return {
        "node": {"id": me.node_id, "address": me.address, "span": member_row(me, "alive")["span"]},
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
            "bottleneck_tokens_per_s": round(current.bottleneck, 3),
        },
    }


def _ms(value: float | None) -> float | None:
    """A measured round trip as this node's status shows it; None when never measured."""
    return None if value is None else round(value, 3)
