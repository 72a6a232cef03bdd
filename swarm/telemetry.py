"""What this machine can do: memory for layers, measured speed per layer per token, load, and
GPU health where pynvml finds an NVIDIA GPU (read by swarm.runtime.gpu.device.GpuMonitor).

Speed is measured on the node's own hardware with the real model's layers at start, then
updated from real work as a moving average, prefill and decode apart."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import psutil
import torch

from swarm.config import RuntimeConfig
from swarm.runtime.execution.devices import device_cap, layer_bytes, splits
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.types import Capacity, LayerSpan, SessionId

log = logging.getLogger(__name__)

_EMA_WEIGHT = 0.2  # weight of the newest sample in the moving averages


def bytes_per_layer(context: ModelContext) -> int:
    """Weight bytes of one decoder layer as this node holds it (the largest, to be safe):
    packed GGUF matrices count their blocks' bytes (a 4-bit node fits ~8x the layers of a
    float32 one), int8 matrices a byte per weight plus a scale per row (~4x)."""
    return layer_bytes(context, context.device)


def layer_memory(runtime: RuntimeConfig, device: torch.device) -> int:
    """Memory for the node's layers: on a node with a GPU (or a capped stand-in), the
    device's cap plus, unless runtime.gpu_only, the RAM the CPU group may take."""
    if splits(runtime):
        ram = 0 if runtime.gpu_only else _ram_memory(runtime)
        return device_cap(runtime, device) + ram
    return _ram_memory(runtime)


def _ram_memory(runtime: RuntimeConfig) -> int:
    return runtime.ram_for_layers(psutil.virtual_memory().available)


@dataclass(frozen=True)
class StepCost:
    """What one decode call costs this machine, idle: a fixed part per call (the batch's
    assembly, rotary tables, cache lookups), then per layer a part per call and a part per
    row. On CPU products a batch of 8 rows costs ~3.5x one row, and a call of 2 layers ~1.3x
    the per-layer time of a long span: a pace taken as wall time over layers would say as
    much about the batches and spans the plan gives a node as about the node, and a plan
    built on it would keep moving (a node given fewer sessions looks faster, takes more
    layers, gets more sessions, looks slower)."""

    step_ms: float
    layer_ms: float
    row_ms: float  # per layer and row

    def expected_ms(self, layers: int, rows: int) -> float:
        return self.step_ms + layers * (self.layer_ms + rows * self.row_ms)

    @property
    def pace_ms(self) -> float:
        """One row through one layer, the fixed part left out: the pace placement compares."""
        return self.layer_ms + self.row_ms

    @property
    def row_share(self) -> float:
        """What each further row of a batch adds, as a share of one row's pace."""
        return self.row_ms / self.pace_ms if self.pace_ms > 0 else 1.0

    def pace_of(self, layers: int, rows: int, elapsed_ms: float) -> float:
        """The pace a call that took `elapsed_ms` for `rows` rows through `layers` layers
        says this machine runs at now: this cost model scaled by how much slower the call
        was than the model expects (a busy or capped machine slows every part alike)."""
        return elapsed_ms / self.expected_ms(layers, rows) * self.pace_ms


@dataclass(frozen=True)
class MeasuredSpeed:
    prefill_ms: float  # per layer per token
    decode: StepCost


_PROBE_ROWS = 4  # sessions of the batched decode a probe times


def measure_speed(
    context: ModelContext,
    runtime: RuntimeConfig,
    prompt_tokens: int = 32,
    decode_steps: int = 8,
    rounds: int = 3,
    shard: Shard | None = None,
) -> MeasuredSpeed:
    """Prefill ms per layer per token, and the decode StepCost, timed on up to four real
    layers: of `shard` when given (an idle node re-measuring itself), else freshly loaded.
    Decode is timed three ways: one row through one layer, one row through all the probe's
    layers, and _PROBE_ROWS rows through them; their differences are the fixed, per-layer and
    per-row parts. Each is the best of `rounds`: a probe competes with whatever else the
    machine is doing, and a spike must not make a fast machine look slow to placement."""
    if shard is None:
        # read for the probe only: the store keeps just the layers this node will serve
        shard = Shard.load(context, LayerSpan(0, min(4, context.num_layers)), runtime, keep=False)
    span = LayerSpan(shard.span.start, min(shard.span.start + 4, shard.span.end))
    one = LayerSpan(span.start, span.start + 1)
    hidden = torch.randn(
        1, prompt_tokens, context.hidden_size, generator=torch.Generator().manual_seed(0)
    )
    sessions = [SessionId(f"telemetry-probe-{i}") for i in range(_PROBE_ROWS)]
    alone = SessionId("telemetry-probe-one-layer")
    shard.forward(sessions[0], hidden[:, :4], 0, span)  # warm-up
    prefill = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        shard.forward(sessions[0], hidden, 0, span)
        shard.synchronize()
        prefill = min(prefill, (time.perf_counter() - start) * 1000 / (len(span) * prompt_tokens))
    for session in sessions[1:]:
        shard.forward(session, hidden, 0, span)
    shard.forward(alone, hidden, 0, one)
    one_layer = all_layers = batched = float("inf")
    position = prompt_tokens
    for _ in range(rounds):
        one_layer = min(one_layer, _decode_ms(shard, [alone], hidden, position, one, decode_steps))
        all_layers = min(
            all_layers, _decode_ms(shard, sessions[:1], hidden, position, span, decode_steps)
        )
        batched = min(batched, _decode_ms(shard, sessions, hidden, position, span, decode_steps))
        position += decode_steps
    for session in (*sessions, alone):
        shard.close_session(session)
    return MeasuredSpeed(prefill, _step_cost(len(span), one_layer, all_layers, batched))


def _decode_ms(
    shard: Shard,
    sessions: list[SessionId],
    hidden: torch.Tensor,
    position: int,
    span: LayerSpan,
    steps: int,
) -> float:
    """Milliseconds per call of `steps` decode calls, one row per session, from `position`;
    batched as a hop runs them, a lone step included."""
    start = time.perf_counter()
    for step in range(steps):
        shard.decode_batch(
            [(s, hidden[:, step : step + 1], position + step) for s in sessions], span
        )
    shard.synchronize()  # a GPU's steps are done, not only queued
    return (time.perf_counter() - start) * 1000 / steps


def _step_cost(layers: int, one_layer: float, all_layers: float, batched: float) -> StepCost:
    """The StepCost that fits: one row through one layer in `one_layer` ms, through `layers`
    in `all_layers`, _PROBE_ROWS rows through them in `batched`. Timing noise can make a
    difference negative; no part is allowed below zero, nor the per-layer pace below a tenth
    of what one layer took."""
    if layers > 1:
        pace = max((all_layers - one_layer) / (layers - 1), one_layer / 10)
        step = max(one_layer - pace, 0.0)
    else:  # a one-layer probe cannot tell the fixed part from the layer
        pace, step = one_layer, 0.0
    row = max((batched - all_layers) / (layers * (_PROBE_ROWS - 1)), 0.0)
    row = min(row, pace)  # a row costs at most what a lone row does
    return StepCost(step, pace - row, row)


@dataclass
class SpeedMeter:
    """Moving averages of ms per layer per token, fed from real steps: prefill as measured,
    decode as the pace the StepCost model reads from each call (see StepCost.pace_of).
    Recorded from the event loop and from the compute thread, which records its own decode
    calls as they end (a call handed to the loop per step woke it, and its hold on the
    interpreter delayed the step's frame). Beside the pace, what a step costs here whatever
    its layers (`fixed_ms`): the call's fixed part, slowed as the pace is, and a moving
    average of the hop's handling of each decode step's frame."""

    prefill_ms: float
    cost: StepCost
    frame_ms: float = 0.0  # the hop's handling of a decode step's frame, until real steps say
    decode_ms: float = field(init=False)
    last_record: float = field(default_factory=time.monotonic)  # when a real step last came
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.decode_ms = self.cost.pace_ms

    @classmethod
    def measured(cls, speed: MeasuredSpeed) -> SpeedMeter:
        return cls(speed.prefill_ms, speed.decode)

    def record_prefill(self, layers: int, tokens: int, elapsed_ms: float) -> None:
        """A prefill of `tokens` tokens through `layers` layers."""
        if layers <= 0 or tokens <= 0:
            return
        with self._lock:
            self.last_record = time.monotonic()
            sample = elapsed_ms / (layers * tokens)
            self.prefill_ms += _EMA_WEIGHT * (sample - self.prefill_ms)

    def record_decode(self, layers: int, rows: int, elapsed_ms: float) -> None:
        """A decode call of `rows` sessions through `layers` layers."""
        if layers <= 0 or rows <= 0:
            return
        with self._lock:
            self.last_record = time.monotonic()
            sample = self.cost.pace_of(layers, rows, elapsed_ms)
            self.decode_ms += _EMA_WEIGHT * (sample - self.decode_ms)

    def record_frame(self, elapsed_ms: float) -> None:
        """A decode step's frame at this hop: authenticating and decoding it, and encoding
        and writing it on."""
        if elapsed_ms < 0:
            return
        with self._lock:
            self.frame_ms += _EMA_WEIGHT * (elapsed_ms - self.frame_ms)

    @property
    def fixed_ms(self) -> float:
        """Ms a decode step costs this node beyond its layers: what placement charges each
        stage it serves. The call's fixed part slows by the pace's measured slowdown (a
        busy or capped machine slows every part alike)."""
        pace = self.cost.pace_ms
        slowdown = self.decode_ms / pace if pace > 0 else 1.0
        return self.cost.step_ms * slowdown + self.frame_ms

    def calibrate(self, speed: MeasuredSpeed) -> None:
        """Fold in a micro-benchmark taken while idle; its cost model replaces the old one."""
        with self._lock:
            self.prefill_ms += _EMA_WEIGHT * (speed.prefill_ms - self.prefill_ms)
            self.cost = speed.decode
            self.decode_ms += _EMA_WEIGHT * (speed.decode.pace_ms - self.decode_ms)
            self.last_record = time.monotonic()


def capacity(context: ModelContext, runtime: RuntimeConfig, speed: SpeedMeter) -> Capacity:
    device = str(context.device)
    return Capacity(
        device=f"{device}+cpu" if splits(runtime) and not runtime.gpu_only else device,
        dtype=runtime.dtype,
        layer_memory_bytes=layer_memory(runtime, context.device),
        bytes_per_layer=bytes_per_layer(context),
        ms_per_layer_prefill=speed.prefill_ms,
        ms_per_layer_decode=speed.decode_ms,
        decode_row_share=speed.cost.row_share,
        ms_per_step_fixed=speed.fixed_ms,
    )
