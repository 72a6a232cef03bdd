"""A decode step through a whole Llama-shaped layer (its feed-forward gate, up and down, or
routed experts) in one native call (`native.dense_decode`) gives the bits the same layer
gives step by step (a norm, a product, the rotary, the attention, ... each its own call): a
node may run one position either way (a decode step one way, a replay or a prefill of it the
other) and must agree with itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.family_models import Checkpoint
from harness.family_runs import DRAFT, runtime_for, steps_after_prefill
from swarm.config import RuntimeConfig
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.families.llama import LlamaBlock
from swarm.runtime.families.moe import MoEBlock
from swarm.runtime.weights import native
from swarm.types import LayerSpan, SessionId

pytestmark = pytest.mark.skipif(
    not native.available(), reason="swarm's kernels are not built for this CPU"
)

# (prompt length, rows) per session: a row a decode step, more a verify step
BATCH = [(8, 1), (5, 4), (12, 1), (3, 3)]
STEPWISE = native.KernelSwitches(dense_layers=False)


def _shards(runtime: RuntimeConfig) -> tuple[EntryModel, LayerSpan, Shard, Shard]:
    """The model's every layer twice: run in one call per layer, and step by step."""
    context = ModelContext.open(runtime, progress=False)
    span = LayerSpan(0, context.num_layers)
    dense = Shard.load(context, span, runtime)
    with native.switched(STEPWISE):
        stepwise = Shard.load(context, span, runtime)
    return EntryModel(context), span, dense, stepwise


def _blocks(shard: Shard, span: LayerSpan) -> list[LlamaBlock]:
    blocks = [shard.block(i) for i in range(span.start, span.end)]
    assert all(isinstance(b, LlamaBlock) for b in blocks)
    return blocks  # type: ignore[return-value]


def _same(dense: Shard, stepwise: Shard, entry: EntryModel, span: LayerSpan) -> None:
    batched = [dense.decode_rows(steps_after_prefill(dense, entry, BATCH), span)]
    batched.append(stepwise.decode_rows(steps_after_prefill(stepwise, entry, BATCH), span))
    assert batched[0].shared and batched[1].shared
    for got, want in zip(batched[0].outputs, batched[1].outputs, strict=True):
        assert isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
        assert torch.equal(got, want)
    # one position alone, through the layer's own call (a one-process decode step)
    one = [s.forward(SessionId("s0"), entry.embed([DRAFT[0]]), 9) for s in (dense, stepwise)]
    assert torch.equal(one[0], one[1])
    for a, b in zip(_blocks(dense, span), _blocks(stepwise, span), strict=True):
        if isinstance(a, MoEBlock) and isinstance(b, MoEBlock):  # the experts it routed to
            assert a.experts.last_experts == b.experts.last_experts


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral"])
def test_a_decode_step_in_one_call_per_layer_has_the_bits_of_its_steps(
    family: str,
    family_checkpoints: dict[tuple[str, str], Checkpoint],
    family_cache: Path,
) -> None:
    """int8 products (every matrix on the kernels), Qwen2's q/k/v biases, Qwen3's q/k norms,
    and the routed experts of Qwen3-MoE and Mixtral."""
    runtime = runtime_for(family_checkpoints[family, "hf"], family_cache, "int8")
    entry, span, dense, stepwise = _shards(runtime)
    assert all(b._dense is not None for b in _blocks(dense, span))
    assert all(b._dense is None for b in _blocks(stepwise, span))
    _same(dense, stepwise, entry, span)


def test_packed_blocks_of_mixed_types_run_in_one_call_with_the_same_bits(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    """A Q4_K_M-like mix: q, k and v of different block types stacked in one layer."""
    runtime = RuntimeConfig(model=str(tiny_gguf), cache_dir=tmp_path, threads=1)
    entry, span, dense, stepwise = _shards(runtime)
    assert all(b._dense is not None for b in _blocks(dense, span))
    _same(dense, stepwise, entry, span)


def test_float_weights_keep_the_step_by_step_layer(
    family_checkpoints: dict[tuple[str, str], Checkpoint], family_cache: Path
) -> None:
    """torch's float products are not the kernels': no layer call for them."""
    runtime = runtime_for(family_checkpoints["llama", "hf"], family_cache, "float32")
    _, span, dense, _ = _shards(runtime)
    assert all(b._dense is None for b in _blocks(dense, span))
