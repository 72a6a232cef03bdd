"""Membership messages <-> wire fields. The gossiper sends them as GossipFrame payloads, under
the gossip key; everything read from a peer goes through `Fields`, so a malformed message is a
FrameError and changes nothing."""

from __future__ import annotations

from typing import Any

from swarm.errors import FrameError, SpanError
from swarm.membership.messages import Ack, Gossip, Message, Ping, PingReq, PushPull
from swarm.membership.updates import Alive, Dead, Left, Suspect, Update
from swarm.types import Capacity, Health, LayerSpan, Load, MemberRecord, ModelId, NodeId
from swarm.wire.fields import Fields

WireFields = dict[str, Any]
_MAX_UPDATES = 1024  # updates in one message (a full state of a large swarm)
MAX_MODEL_NAMES = 8  # names one member record may give its model
MAX_MODEL_NAME_CHARS = 200  # characters of one of them


def message_to_wire(message: Message) -> tuple[str, WireFields]:
    """(kind, fields) for a GossipFrame."""
    head: WireFields = {"from": message.sender, "reply": message.reply_to}
    if isinstance(message, PushPull):
        state = [update_to_wire(u) for u in message.state]
        return "pushpull", {**head, "state": state, "is_reply": message.reply, "join": message.join}
    head["updates"] = [update_to_wire(u) for u in message.updates]
    if isinstance(message, Ping):
        return "ping", {**head, "seq": message.seq, "target": message.target}
    if isinstance(message, PingReq):
        extra = {
            "seq": message.seq,
            "target": message.target,
            "target_addr": message.target_address,
        }
        return "pingreq", {**head, **extra}
    if isinstance(message, Ack):
        return "ack", {**head, "seq": message.seq}
    return "gossip", head


def message_from_wire(kind: str, f: Fields) -> Message:
    sender, reply_to = NodeId(f.get_str("from")), f.get_str("reply")
    if kind == "pushpull":
        state = _updates(f, "state")
        return PushPull(sender, reply_to, state, _bool(f, "is_reply"), _bool(f, "join"))
    updates = _updates(f, "updates")
    if kind == "ping":
        return Ping(sender, reply_to, f.get_int("seq"), NodeId(f.get_str("target")), updates)
    if kind == "pingreq":
        target, address = NodeId(f.get_str("target")), f.get_str("target_addr")
        return PingReq(sender, reply_to, f.get_int("seq"), target, address, updates)
    if kind == "ack":
        return Ack(sender, reply_to, f.get_int("seq"), updates)
    if kind == "gossip":
        return Gossip(sender, reply_to, updates)
    raise FrameError(f"unknown gossip message kind {kind!r}")


def update_to_wire(update: Update) -> WireFields:
    if isinstance(update, Alive):
        return {"s": "alive", "record": record_to_wire(update.record)}
    body: WireFields = {"id": update.node_id, "inc": update.incarnation}
    if isinstance(update, Left):
        return {"s": "left", **body}
    kind = "suspect" if isinstance(update, Suspect) else "dead"
    return {"s": kind, **body, "by": update.from_node}


def update_from_wire(f: Fields) -> Update:
    kind = f.get_str("s")
    if kind == "alive":
        return Alive(record_from_wire(f.get_fields("record")))
    node_id, incarnation = NodeId(f.get_str("id")), f.get_int("inc")
    if kind == "left":
        return Left(node_id, incarnation)
    if kind == "suspect":
        return Suspect(node_id, incarnation, NodeId(f.get_str("by")))
    if kind == "dead":
        return Dead(node_id, incarnation, NodeId(f.get_str("by")))
    raise FrameError(f"unknown member state {kind!r}")


def record_to_wire(r: MemberRecord) -> WireFields:
    c, load, h = r.capacity, r.load, r.health
    fields: WireFields = {
        "id": r.node_id,
        "addr": r.address,
        "inc": r.incarnation,
        "model": r.model_id,
        "layers": r.num_layers,
        "cap": {
            "device": c.device,
            "dtype": c.dtype,
            "mem": c.layer_memory_bytes,
            "per_layer": c.bytes_per_layer,
            "prefill_ms": c.ms_per_layer_prefill,
            "decode_ms": c.ms_per_layer_decode,
            "row_share": c.decode_row_share,
            "fixed_ms": c.ms_per_step_fixed,
        },
        "load": {
            "sessions": load.active_sessions,
            "queue": load.queue_depth,
            "kv_free": load.kv_free_bytes,
        },
    }
    if r.span is not None:
        fields["span"] = [r.span.start, r.span.end]
    if r.draining:
        fields["drain"] = True
    if r.pinned:
        fields["pinned"] = True
    if r.resumes is not None:
        fields["resumes"] = [r.resumes.start, r.resumes.end]
    if r.names:
        fields["names"] = list(r.names)
    if r.reloads:
        fields["reloads"] = r.reloads
    readings = (
        ("temp", h.gpu_temperature_c),
        ("util", h.gpu_utilization),
        ("used", h.gpu_memory_used_bytes),
        ("total", h.gpu_memory_total_bytes),
        ("power", h.gpu_power_w),
        ("throttle", h.gpu_throttle_reasons),
    )
    gpu = {k: v for k, v in readings if v is not None}
    if gpu:
        fields["gpu"] = gpu
    return fields


def record_from_wire(f: Fields) -> MemberRecord:
    cap, load = f.get_fields("cap"), f.get_fields("load")
    capacity = Capacity(
        device=cap.get_str("device"),
        dtype=cap.get_str("dtype"),
        layer_memory_bytes=cap.get_int("mem"),
        bytes_per_layer=cap.get_int("per_layer", lo=1),
        ms_per_layer_prefill=cap.get_float("prefill_ms"),
        ms_per_layer_decode=cap.get_float("decode_ms"),
        decode_row_share=min(1.0, cap.get_float("row_share", 1.0)),
        ms_per_step_fixed=cap.get_float("fixed_ms", 0.0),
    )
    num_layers = f.get_int("layers", lo=1)
    return MemberRecord(
        node_id=NodeId(f.get_str("id")),
        address=f.get_str("addr"),
        incarnation=f.get_int("inc"),
        model_id=ModelId(f.get_str("model")),
        num_layers=num_layers,
        capacity=capacity,
        span=_span(f, "span", num_layers),
        load=Load(
            load.get_int("sessions", 0), load.get_int("queue", 0), load.get_int("kv_free", 0)
        ),
        health=_health(f),
        draining=f.get_bool("drain", False),
        pinned=f.get_bool("pinned", False),
        resumes=_span(f, "resumes", num_layers),
        names=_names(f),
        reloads=f.get_int("reloads", 0),
    )


def _names(f: Fields) -> tuple[str, ...]:
    raw = f.get_list("names", [])
    if len(raw) > MAX_MODEL_NAMES:
        raise FrameError(f"record.names holds {len(raw)} names, more than {MAX_MODEL_NAMES}")
    if not all(isinstance(n, str) and 0 < len(n) <= MAX_MODEL_NAME_CHARS for n in raw):
        raise FrameError(f"record.names must be strings of 1 to {MAX_MODEL_NAME_CHARS} characters")
    return tuple(raw)


def _span(f: Fields, key: str, num_layers: int) -> LayerSpan | None:
    raw = f.get_list(key, [])
    if not raw:
        return None
    if len(raw) != 2 or not all(type(v) is int for v in raw):
        raise FrameError(f"record.{key} must be [start, end]")
    try:
        span = LayerSpan(raw[0], raw[1])
        span.check_within(num_layers)
    except SpanError as e:
        raise FrameError(f"record.{key}: {e}") from None
    return span


def _health(f: Fields) -> Health:
    if not f.has("gpu"):
        return Health()
    gpu = f.get_fields("gpu")
    return Health(
        gpu_temperature_c=gpu.get_float("temp", lo=-273.0) if gpu.has("temp") else None,
        gpu_utilization=gpu.get_float("util") if gpu.has("util") else None,
        gpu_memory_used_bytes=gpu.get_int("used") if gpu.has("used") else None,
        gpu_memory_total_bytes=gpu.get_int("total") if gpu.has("total") else None,
        gpu_power_w=gpu.get_float("power") if gpu.has("power") else None,
        gpu_throttle_reasons=gpu.get_int("throttle") if gpu.has("throttle") else None,
    )


def _bool(f: Fields, key: str) -> bool:
    return f.get_bool(key, False)


def _updates(f: Fields, key: str) -> tuple[Update, ...]:
    items = f.items(key, [])
    if len(items) > _MAX_UPDATES:
        raise FrameError(f"{key} holds {len(items)} updates, more than {_MAX_UPDATES}")
    return tuple(update_from_wire(item) for item in items)
