"""Phi-3 (and Phi-3.5/Phi-4-mini with plain rotary): fused qkv and gate_up matrices, one
sliding window for every layer; transformers' own layer runs it."""

from __future__ import annotations

from typing import Any

from swarm.errors import UnsupportedModelError
from swarm.runtime.families.family import Family, every_layer_windowed, gguf_field, gguf_tensor
from swarm.runtime.families.generic import hf_block


def _gguf_config(config: Any, reader: Any) -> None:
    if gguf_tensor(reader, "rope_factors_long.weight") is not None:
        raise UnsupportedModelError(
            "model type 'phi3' with long-context rope factors (longrope) is not supported; "
            "the phi3 adapter implements rope type default"
        )
    window = gguf_field(reader, "phi3.attention.sliding_window")
    config.sliding_window = int(window) if window else None
    # the config class default (32000) lies outside the vocabulary of a file that sets none
    if config.pad_token_id is not None and config.pad_token_id >= config.vocab_size:
        config.pad_token_id = None


FAMILY = Family(
    name="phi3",
    model_types=("phi3",),
    gguf_architectures=("phi3",),
    block=hf_block,
    attention=every_layer_windowed,
    gguf_config=_gguf_config,
)
