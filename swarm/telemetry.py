"""What this machine can do: memory for layers, measured speed per layer per token, load, and
GPU health where pynvml finds an NVIDIA GPU.

Speed is measured on the node's own hardware with the real model's layers at start, then
updated from real work as a moving average, prefill and decode apart."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch

from swarm.config import RuntimeConfig
from swarm.runtime import ggml
from swarm.runtime.model import ModelContext
from swarm.runtime.quant import weight_bytes
from swarm.runtime.shard import Shard
from swarm.types import Capacity, Health, LayerSpan, SessionId

log = logging.getLogger(__name__)

_AUTO_MEMORY_FRACTION = 0.7  # of free memory, when runtime.layer_memory_bytes is 0
_EMA_WEIGHT = 0.2  # weight of the newest sample in the moving averages


def bytes_per_layer(context: ModelContext) -> int:
    """Weight bytes of one decoder layer as this node holds it (the largest, to be safe):
    packed GGUF matrices count their blocks' bytes (a 4-bit node fits ~8x the layers of a
    float32 one), int8 matrices a byte per weight plus a scale per row (~4x)."""
    element = torch.empty((), dtype=context.dtype).element_size()
    sizes = []
    for part, record in context.store.manifest.parts.items():
        if part.startswith("layer-"):
            sizes.append(
                sum(
                    ggml.row_bytes(record.quant[name], shape[-1]) * shape[0]
                    if context.packed and name in record.quant
                    else weight_bytes(shape, element, context.int8)
                    for name, shape in record.params.items()
                )
            )
    return max(sizes)


def layer_memory(runtime: RuntimeConfig, device: torch.device) -> int:
    if runtime.layer_memory_bytes:
        return runtime.layer_memory_bytes
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * _AUTO_MEMORY_FRACTION)
    return int(psutil.virtual_memory().available * _AUTO_MEMORY_FRACTION)


def measure_speed(
    context: ModelContext,
    runtime: RuntimeConfig,
    prompt_tokens: int = 32,
    decode_steps: int = 8,
    rounds: int = 3,
    shard: Shard | None = None,
) -> tuple[float, float]:
    """(ms per layer per token for prefill, for decode), timed on up to four real layers: of
    `shard` when given (an idle node re-measuring itself), else freshly loaded. The best of
    `rounds`: a probe competes with whatever else the machine is doing, and a spike must not
    make a fast machine look slow to placement."""
    if shard is None:
        # read for the probe only: the store keeps just the layers this node will serve
        shard = Shard.load(context, LayerSpan(0, min(4, context.num_layers)), runtime, keep=False)
    span = LayerSpan(shard.span.start, min(shard.span.start + 4, shard.span.end))
    session = SessionId("telemetry-probe")
    hidden = torch.randn(
        1, prompt_tokens, context.hidden_size, generator=torch.Generator().manual_seed(0)
    )
    shard.forward(session, hidden[:, :4], 0, span)  # warm-up
    prefill, decode = float("inf"), float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        shard.forward(session, hidden, 0, span)
        prefill = min(prefill, (time.perf_counter() - start) * 1000 / (len(span) * prompt_tokens))
        start = time.perf_counter()
        for step in range(decode_steps):
            shard.forward(session, hidden[:, step : step + 1], prompt_tokens + step, span)
        decode = min(decode, (time.perf_counter() - start) * 1000 / (len(span) * decode_steps))
    shard.close_session(session)
    return prefill, decode


@dataclass
class SpeedMeter:
    """Moving averages of ms per layer per token, fed from real steps."""

    prefill_ms: float
    decode_ms: float
    last_record: float = field(default_factory=time.monotonic)  # when a real step last came

    def record(self, layers: int, tokens: int, elapsed_ms: float) -> None:
        if layers <= 0 or tokens <= 0:
            return
        self.last_record = time.monotonic()
        sample = elapsed_ms / (layers * tokens)
        if tokens == 1:
            self.decode_ms += _EMA_WEIGHT * (sample - self.decode_ms)
        else:
            self.prefill_ms += _EMA_WEIGHT * (sample - self.prefill_ms)

    def calibrate(self, prefill_ms: float, decode_ms: float) -> None:
        """Fold in a micro-benchmark taken while idle (ms per layer per token)."""
        self.prefill_ms += _EMA_WEIGHT * (prefill_ms - self.prefill_ms)
        self.decode_ms += _EMA_WEIGHT * (decode_ms - self.decode_ms)
        self.last_record = time.monotonic()


def capacity(context: ModelContext, runtime: RuntimeConfig, speed: SpeedMeter) -> Capacity:
    return Capacity(
        device=str(context.device),
        dtype=runtime.dtype,
        layer_memory_bytes=layer_memory(runtime, context.device),
        bytes_per_layer=bytes_per_layer(context),
        ms_per_layer_prefill=speed.prefill_ms,
        ms_per_layer_decode=speed.decode_ms,
    )


@dataclass
class GpuMonitor:
    """Reads temperature, utilisation and memory through pynvml; Health() without a GPU."""

    index: int = 0
    _handle: Any = field(default=None, init=False)
    _tried: bool = field(default=False, init=False)

    def read(self) -> Health:
        handle = self._open()
        if handle is None:
            return Health()
        import pynvml

        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            return Health(
                gpu_temperature_c=float(
                    pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
                ),
                gpu_utilization=pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                gpu_memory_used_bytes=int(memory.used),
                gpu_memory_total_bytes=int(memory.total),
            )
        except pynvml.NVMLError as e:
            log.warning("GPU readings failed: %s", e)
            return Health()

    def _open(self) -> Any:
        if not self._tried:
            self._tried = True
            try:
                import pynvml

                pynvml.nvmlInit()
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            except Exception as e:  # no driver, no GPU, no library: all mean "no GPU readings"
                log.debug("no NVIDIA GPU readings: %s", e)
                self._handle = None
        return self._handle
