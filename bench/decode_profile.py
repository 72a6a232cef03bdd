"""Where a decode step's time goes: torch.profiler over real decode steps (embed, every layer,
head, greedy pick), each op's self time put in a group. Matrix products are told apart by
their shapes (the fused qkv, o, gate/up and down matrices, the head). What the ops do not
account for is Python and dispatch overhead between them."""

from __future__ import annotations

import contextlib
import functools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from harness.quality import Runtime
from swarm.runtime.weights import native
from swarm.types import SessionId

_NATIVE = "swarm::matmul"  # swarm's own kernels, named with their matrix's shape
_NATIVE_STEPS = "swarm::norm-rotary"  # swarm's RMS norm and rotary calls
_NATIVE_ATTENTION = "swarm::decode-attention"  # swarm's cache writes and attention, one call
_NATIVE_LAYER = "swarm::dense-layer"  # a whole decoder layer's decode step, one call

_MATMULS = {
    "aten::mm",
    "aten::addmm",
    "aten::_weight_int8pack_mm",
    "aten::_weight_int4pack_mm_for_cpu",
    "aten::bmm",
    "aten::matmul",
}
_ATTENTION = ("attention", "softmax", "aten::_scaled_dot_product")
_NORM = {"aten::pow", "aten::mean", "aten::rsqrt", "aten::add", "aten::mul"}
GROUPS = (
    "whole layers (one call each)",
    "attn projections (qkv, o)",
    "MLP (gate/up, down)",
    "attention",
    "norms, rotary, residual",
    "KV cache writes",
    "head (lm_head)",
    "embed + sampling",
    "dtype casts",
    "other ops",
    "Python + dispatch overhead",
)


def _group(name: str, shapes: Any, head_rows: int, mlp_dim: int) -> str:
    if name.startswith(_NATIVE):
        name, shapes = "aten::mm", [[int(d) for d in name.split()[1].split("x")]]
    if name in _MATMULS:
        dims = {d for shape in shapes if shape for d in shape}
        if head_rows in dims:
            return "head (lm_head)"
        if mlp_dim in dims or 2 * mlp_dim in dims:
            return "MLP (gate/up, down)"
        return "attn projections (qkv, o)"
    if name == _NATIVE_LAYER:  # its products, norms and attention are not told apart
        return "whole layers (one call each)"
    if name == _NATIVE_STEPS:
        return "norms, rotary, residual"
    if name == _NATIVE_ATTENTION:  # the cache writes are in it too
        return "attention"
    if any(key in name for key in _ATTENTION):
        return "attention"
    if name in {"aten::copy_", "aten::to", "aten::_to_copy"}:
        return "dtype casts"
    if name in {"aten::slice", "aten::select"} or "index_put" in name:
        return "KV cache writes"
    if name in _NORM or name in {"aten::neg", "aten::cat", "aten::silu", "aten::sin", "aten::cos"}:
        return "norms, rotary, residual"
    if name in {"aten::embedding", "aten::argmax", "aten::index_select"}:
        return "embed + sampling"
    return "other ops"


@torch.inference_mode()
def profile_decode(model: Runtime, prompt: list[int], steps: int) -> dict[str, float]:
    """Milliseconds per decode step by group (GROUPS), plus "total"."""
    session = SessionId("profile-probe")
    shard, entry = model.shard, model.entry
    shard.close_session(session)
    hidden = shard.forward(session, entry.embed(prompt), 0)
    position = len(prompt)

    def step() -> None:
        nonlocal hidden, position
        token = int(entry.logits(hidden).argmax())
        hidden = shard.forward(session, entry.embed([token]), position)
        position += 1

    for _ in range(4):  # warm-up
        step()
    with _native_recorded(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        wall_ms = (time.perf_counter() - start) * 1000
    shard.close_session(session)
    totals: dict[str, float] = defaultdict(float)
    head_rows, mlp_dim = entry.vocab_size, int(shard.context.config.intermediate_size)
    for event in prof.key_averages(group_by_input_shape=True):
        group = _group(event.key, event.input_shapes, head_rows, mlp_dim)
        totals[group] += event.self_cpu_time_total / 1000  # us -> ms
    per_step = {g: totals.get(g, 0.0) / steps for g in GROUPS}
    per_step["total"] = wall_ms / steps
    # the profiler's own cost inflates wall time a little; it is counted as overhead
    per_step["Python + dispatch overhead"] = max(
        0.0, per_step["total"] - sum(v for k, v in per_step.items() if k != "total")
    )
    return per_step


@contextlib.contextmanager
def _native_recorded() -> Iterator[None]:
    """swarm's kernels are C calls, which the profiler does not see: name each call (and a
    product's matrix shape) while profiling."""
    originals: dict[str, Callable[..., Any]] = {
        "q4_matmul": native.q4_matmul,
        "i8_matmul": native.i8_matmul,
        "block_matmul": native.block_matmul,
        "rms_norm": native.rms_norm,
        "rotate_": native.rotate_,
        "decode_attention": native.decode_attention,
        "dense_decode": native.dense_decode,
    }

    def product(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        @functools.wraps(function)
        def call(weights: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
            rows, cols = weights.shape[0], rest[-1].shape[-1]
            with torch.profiler.record_function(f"{_NATIVE} {rows}x{cols}"):
                return function(weights, *rest)

        return call

    def step(function: Callable[..., Any], label: str) -> Callable[..., Any]:
        @functools.wraps(function)
        def call(*args: Any) -> Any:
            with torch.profiler.record_function(label):
                return function(*args)

        return call

    def block_product(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        @functools.wraps(function)
        def call(qtype: str, blocks: torch.Tensor, grid: Any, cols: int, x: Any) -> Any:
            with torch.profiler.record_function(f"{_NATIVE} {blocks.shape[0]}x{cols}"):
                return function(qtype, blocks, grid, cols, x)

        return call

    try:
        for name, function in originals.items():
            if name == "block_matmul":  # GGUF's blocks as stored: (type, blocks, grid, cols, x)
                setattr(native, name, block_product(function))
            elif name.endswith("matmul"):
                setattr(native, name, product(function))
            else:
                labels = {"decode_attention": _NATIVE_ATTENTION, "dense_decode": _NATIVE_LAYER}
                label = labels.get(name, _NATIVE_STEPS)
                setattr(native, name, step(function, label))
        yield
    finally:
        for name, function in originals.items():
            setattr(native, name, function)
