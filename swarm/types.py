"""Small domain types shared by every layer of swarm: ids, layer spans, member records,
host:port addresses."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NewType

from swarm.errors import ConfigError, SpanError

SessionId = NewType("SessionId", str)
ModelId = NewType("ModelId", str)  # hex sha256 of the checkpoint's content


@dataclass(frozen=True, order=True)
class LayerSpan:
    """Decoder layers [start, end) that one shard runs."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end <= self.start:
            raise SpanError(f"invalid layer span {self.start}:{self.end}: need 0 <= start < end")

    def __len__(self) -> int:
        return self.end - self.start

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end))

    def __str__(self) -> str:
        return f"{self.start}:{self.end}"

    def check_within(self, num_layers: int) -> None:
        if self.end > num_layers:
            raise SpanError(f"layer span {self} is out of range: the model has {num_layers} layers")

    @classmethod
    def parse(cls, text: str) -> LayerSpan:
        """Parse `a:b`."""
        parts = text.strip().split(":")
        if len(parts) != 2:
            raise SpanError(f"invalid layer span {text!r}: expected start:end, e.g. 0:10")
        try:
            return cls(int(parts[0]), int(parts[1]))
        except ValueError:
            raise SpanError(
                f"invalid layer span {text!r}: start and end must be integers"
            ) from None


def uncovered_spans(covered: Sequence[bool]) -> tuple[LayerSpan, ...]:
    """The maximal runs of layers whose flag is False, as spans."""
    gaps: list[LayerSpan] = []
    start: int | None = None
    for layer, ok in enumerate([*covered, True]):
        if not ok and start is None:
            start = layer
        elif ok and start is not None:
            gaps.append(LayerSpan(start, layer))
            start = None
    return tuple(gaps)


def parse_split(text: str, num_layers: int) -> list[LayerSpan]:
    """Parse `0:10,10:20,20:30` into spans that must cover [0, num_layers) in order."""
    spans = [LayerSpan.parse(part) for part in text.split(",") if part.strip()]
    if not spans:
        raise SpanError("empty split: expected spans like 0:10,10:30")
    expected_start = 0
    for span in spans:
        span.check_within(num_layers)
        if span.start != expected_start:
            raise SpanError(
                f"split {text!r} does not chain: span {span} should start at {expected_start}"
            )
        expected_start = span.end
    if expected_start != num_layers:
        raise SpanError(f"split {text!r} stops at layer {expected_start} of {num_layers}")
    return spans


NodeId = NewType("NodeId", str)  # stable per machine, kept on disk


@dataclass(frozen=True)
class Hop:
    """One node of a request's route and the layers it runs there: what routing finds, what a
    step's frame carries (`swarm.wire.messages` converts it at the edge) and what a trace
    shows (`swarm.schema.RouteHop` is its JSON)."""

    node_id: NodeId
    address: str  # host:port of its node-to-node endpoint
    span: LayerSpan  # the layers it runs: from where it is entered to the end of its span


class MemberState(enum.Enum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


@dataclass(frozen=True)
class Load:
    active_sessions: int = 0
    queue_depth: int = 0  # compute jobs waiting
    kv_free_bytes: int = 0  # KV cache budget not in use


@dataclass(frozen=True)
class Health:
    """GPU readings where pynvml finds an NVIDIA GPU; None elsewhere."""

    gpu_temperature_c: float | None = None
    gpu_utilization: float | None = None  # 0..1
    gpu_memory_used_bytes: int | None = None
    gpu_memory_total_bytes: int | None = None
    gpu_power_w: float | None = None  # watts drawn now
    # nvml's clock throttle reasons, a bit mask (swarm.runtime.gpu.share.THROTTLE_REASONS)
    gpu_throttle_reasons: int | None = None


@dataclass(frozen=True)
class Capacity:
    """What a node can do, measured on its own hardware with the real model's layers."""

    device: str  # "cpu", "cuda:0"
    dtype: str  # "float32", "bfloat16", ...
    layer_memory_bytes: int  # memory available for decoder layers (weights + KV)
    bytes_per_layer: int  # weight bytes of one decoder layer in this dtype
    ms_per_layer_prefill: float  # per layer per token
    ms_per_layer_decode: float  # per layer per token
    # what each further row of a batched decode call adds, as a share of a lone row's
    # per-layer time (its StepCost's row part over its pace): near 1 where products are
    # compute-bound, near 0 where a batch costs what one row does; 1 from a node that does not
    # say
    decode_row_share: float = 1.0
    # ms a decode step costs this node beyond its layers' pace: the call's fixed part (the
    # batch's assembly, rotary tables, cache lookups) and the step's frame at the hop
    # (opening it, sending it on); placement charges it to every stage the node serves. 0
    # from a node that does not say
    ms_per_step_fixed: float = 0.0

    def max_layers(self) -> int:
        return self.layer_memory_bytes // max(1, self.bytes_per_layer)


@dataclass(frozen=True)
class MemberRecord:
    """What a node says about itself; gossip spreads it. Higher incarnation wins."""

    node_id: NodeId
    address: str  # "host:port" of the node's one HTTP/websocket port
    incarnation: int
    model_id: ModelId
    num_layers: int  # of the model, so peers can check spans
    capacity: Capacity
    span: LayerSpan | None  # the layers served now, None while loading or serving none
    load: Load = Load()
    health: Health = Health()
    draining: bool = False  # leaving: finishes the sessions it holds, takes no new ones
    pinned: bool = False  # serves a span set by its admin (--span) and never moves
    # the span it served when it last stopped (None: a first start): the placement gives it
    # back where no member serves those layers otherwise than before its own stop (its
    # prompt blocks on disk are for that span; a lab restarted whole comes back as it was).
    # A pinned node announces its own span here from its start: what it loads, and so
    # layers an entry waits for while it does
    resumes: LayerSpan | None = None
    # the names clients call its model by, the served name first (empty from a node that
    # announces none): every node of the swarm accepts any of them in a request's `model`
    names: tuple[str, ...] = ()
    # times it reloaded its layers from its store since it started, each at the request of
    # an entry whose spot-check convicted it: that entry lets it back into its routes on
    # seeing the count rise (swarm/inference/spot_checks.py, `lifted`)
    reloads: int = 0


def split_host_port(address: str) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host without brackets, port); ConfigError otherwise."""
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ConfigError(f"{address!r} is not host:port (an IPv6 address goes in brackets)")
    return host, int(port)


def join_host_port(host: str, port: int) -> str:
    """The inverse of `split_host_port`: IPv6 addresses get brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
