"""The lean block (`llama.LlamaBlock`) computes transformers' decoder layer bit for bit on
float weights, for every family it serves: Llama, and Qwen3's q/k norms, and Qwen3-MoE's and
Mixtral's attention with swarm's sparse feed-forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.family_models import PROMPT, Checkpoint
from swarm.config import RuntimeConfig
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.families.llama import LlamaBlock
from swarm.types import LayerSpan, SessionId


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe", "mixtral"])
def test_the_lean_block_is_transformers_layer_bit_for_bit(
    family: str, family_checkpoints: dict[tuple[str, str], Checkpoint], family_cache: Path
) -> None:
    checkpoint = family_checkpoints[family, "hf"]
    runtime = RuntimeConfig(model=str(checkpoint.path), cache_dir=family_cache, threads=1)
    context = ModelContext.open(runtime, progress=False)
    layers = context.num_layers - 1  # the last layer's output is normed in hidden_states
    shard = Shard.load(context, LayerSpan(0, layers), runtime)
    assert all(isinstance(shard.block(i), LlamaBlock) for i in range(layers))
    ours = shard.forward(SessionId("s"), EntryModel(context).embed(PROMPT), 0)
    with torch.inference_mode():
        theirs = checkpoint.model(torch.tensor([PROMPT]), output_hidden_states=True)
    assert torch.equal(ours, theirs.hidden_states[layers])
