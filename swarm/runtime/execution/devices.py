"""Which device each layer of a span runs on. A node with a GPU holds the first layers of its
span there, as many as `runtime.gpu_memory_bytes` (or the device's free memory less a margin)
has room for with their KV share and a prefill's activations; the rest run on the CPU in the
same process, and the hidden states cross once per step (docs/architecture.md, "A node that
is part GPU"). On cpu a cap splits the span into two CPU groups: the stand-in that runs the
split path where there is no GPU."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from swarm.config import RuntimeConfig
from swarm.errors import ConfigError
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.gpu import matrix as gpu
from swarm.runtime.gpu.device import accelerator
from swarm.runtime.gpu.share import device_layers
from swarm.runtime.weights import ggml, on_gpu
from swarm.runtime.weights.quant import weight_bytes
from swarm.types import LayerSpan

log = logging.getLogger(__name__)

CPU = torch.device("cpu")
# the float activations a prefill call holds at once, per token, in hidden sizes: the
# residual stream, attention's inputs and outputs and the feed-forward's up and gate rows
# (about 3x hidden wide each) come to well under this
_ACTIVATION_WIDTHS = 16


@dataclass(frozen=True)
class Placement:
    """Where a span's layers run: the first `held` on `device`, the rest on the CPU."""

    device: torch.device
    held: int  # layers in the device group
    layers: int  # in the span

    @classmethod
    def whole(cls, device: torch.device, layers: int) -> Placement:
        return cls(device, layers, layers)

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """Each layer's device, from the span's first."""
        return (self.device,) * self.held + (CPU,) * (self.layers - self.held)

    def group(self, offset: int) -> int:
        """0 for a layer (by its offset in the span) of the device group, 1 for the CPU's."""
        return 0 if offset < self.held else 1


def splits(runtime: RuntimeConfig) -> bool:
    """Whether a cap applies: every cuda node, and a cpu node given one (the stand-in)."""
    return runtime.device == "cuda" or runtime.gpu_memory_bytes > 0


def layer_bytes(context: ModelContext, device: torch.device) -> int:
    """Weight bytes of one decoder layer as `device` holds it (the largest, to be safe)."""
    element = torch.empty((), dtype=context.dtype).element_size()
    halves = context.packed and on_gpu.runs_triton(device)
    return max(
        sum(
            param_bytes(
                record.quant.get(name) if context.packed else None,
                shape,
                element,
                context.int8,
                halves,
            )
            for name, shape in record.params.items()
        )
        for part, record in context.store.manifest.parts.items()
        if part.startswith("layer-")
    )


def param_bytes(
    qtype: str | None, shape: tuple[int, ...], element: int, int8: bool, halves: bool
) -> int:
    """Bytes of one parameter where it runs: a packed matrix (`qtype`) its blocks' bytes, or
    float16's where the device dequantizes it at load (`halves`: a GPU with Triton, and a type
    without a kernel); int8 matrices a byte per weight plus a scale per row; the rest their
    float elements."""
    if qtype is None:
        return weight_bytes(shape, element, int8)
    if halves and qtype not in gpu.KERNEL_TYPES:
        return 2 * shape[0] * shape[-1]
    return ggml.row_bytes(qtype, shape[-1]) * shape[0]


def activation_bytes(context: ModelContext, runtime: RuntimeConfig) -> int:
    """What a prefill call's activations may take on the device, at most."""
    tokens = max(runtime.prefill_chunk_tokens, runtime.prefill_batch_tokens)
    element = torch.empty((), dtype=context.dtype).element_size()
    return tokens * _ACTIVATION_WIDTHS * context.hidden_size * element


def cap_holding(context: ModelContext, runtime: RuntimeConfig, held: int, layers: int) -> int:
    """The --gpu-memory that holds exactly `held` of a `layers`-layer span on the node's
    device (what checks of the split path set)."""
    per_layer = layer_bytes(context, context.device) + runtime.kv_cache_bytes // layers
    return activation_bytes(context, runtime) + held * per_layer


def device_cap(runtime: RuntimeConfig, device: torch.device) -> int:
    """The bytes the device group may take: the cap given, else the device's free memory
    less the margin."""
    if runtime.gpu_memory_bytes:
        return runtime.gpu_memory_bytes
    free = accelerator(device).memory().free_bytes
    return max(free - runtime.gpu_memory_margin_bytes, 0)


def placement(context: ModelContext, span: LayerSpan, runtime: RuntimeConfig) -> Placement:
    """Where the layers of `span` run: the first ones on the node's device, as many as fit
    its cap, the rest on the CPU. ConfigError where `runtime.gpu_only` and they do not
    all fit: before a layer is read, so a node never starts half-loaded."""
    device = context.device
    if not splits(runtime):
        return Placement.whole(device, len(span))
    cap = device_cap(runtime, device)
    per_layer = layer_bytes(context, device)
    kv = runtime.kv_cache_bytes // max(len(span), 1)
    reserve = activation_bytes(context, runtime)
    held = device_layers(len(span), per_layer, kv, cap, reserve)
    if runtime.gpu_only and held < len(span):
        raise ConfigError(_too_small(context, span, held, cap, per_layer + kv, reserve))
    if held < len(span):
        log.info(
            "layers %s on %s (%.0f MiB of layers and their KV each, %.0f MiB for "
            "activations, within %.0f MiB); layers %s on the CPU",
            LayerSpan(span.start, span.start + held),
            device,
            (per_layer + kv) / 2**20,
            reserve / 2**20,
            cap / 2**20,
            LayerSpan(span.start + held, span.end),
        )
    return Placement(device, held, len(span))


def _too_small(
    context: ModelContext, span: LayerSpan, held: int, cap: int, per_layer: int, reserve: int
) -> str:
    """The one line a --gpu-only node that does not fit stops with, naming what would help."""
    slow = on_gpu.load_note(context.store.load_layer(span.start, False), context.device)
    halves = f"; {slow}" if slow and held == 0 else ""
    fits = "not one layer" if held == 0 else f"{held} of the {len(span)} layers {span}"
    return (
        f"--gpu-only: {cap / 2**20:.0f} MiB of {context.device} (--gpu-memory) holds {fits}: "
        f"each takes {per_layer / 2**20:.1f} MiB with its KV share, and a prefill "
        f"{reserve / 2**20:.1f} MiB{halves}; give more --gpu-memory, a --span of "
        "fewer layers, or drop --gpu-only to run the rest on the CPU"
    )
