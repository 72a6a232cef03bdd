"""Qwen2 and Qwen2.5: Llama's layer with q/k/v biases; sliding windows per `layer_types`."""

from __future__ import annotations

from swarm.runtime.families.family import Family, layer_types_attention
from swarm.runtime.families.llama import lean_or_hf_block

FAMILY = Family(
    name="qwen2",
    model_types=("qwen2",),
    gguf_architectures=("qwen2",),
    block=lean_or_hf_block,
    attention=layer_types_attention,
)
