"""Qwen3 (dense): q and k are RMS-normed per head before the rotation; the lean block runs it
(`llama.LlamaBlock`), transformers' own layer where that does not apply."""

from __future__ import annotations

from typing import Any

from swarm.runtime.families.family import Family, gguf_field, layer_types_attention
from swarm.runtime.families.llama import lean_or_hf_block


def gguf_head_dim(config: Any, reader: Any, architecture: str) -> None:
    # transformers' GGUF reader leaves Qwen3's head size at the config class default
    head_dim = gguf_field(reader, f"{architecture}.attention.key_length")
    if head_dim:
        config.head_dim = int(head_dim)


def _gguf_config(config: Any, reader: Any) -> None:
    gguf_head_dim(config, reader, "qwen3")


FAMILY = Family(
    name="qwen3",
    model_types=("qwen3",),
    gguf_architectures=("qwen3",),
    block=lean_or_hf_block,
    attention=layer_types_attention,
    gguf_config=_gguf_config,
)
