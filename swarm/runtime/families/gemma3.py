"""Gemma-3 (text): Gemma-2's embedding scale and (1 + w) norms, q/k norms, five sliding
layers to one full, and a rotary table per layer type (local and global base frequency, the
global one optionally scaled linearly)."""

from __future__ import annotations

from typing import Any

from swarm.runtime.families.family import FULL, Family, gguf_field, layer_types_attention
from swarm.runtime.families.gemma2 import (
    attention_scalar_from_gguf,
    eager_if_softcapped,
    embed_scale,
    final_softcap,
)
from swarm.runtime.families.generic import hf_block


def _gguf_config(config: Any, reader: Any) -> None:
    attention_scalar_from_gguf(config, large_layers=62)
    scaling = gguf_field(reader, "gemma3.rope.scaling.type")
    factor = gguf_field(reader, "gemma3.rope.scaling.factor")
    if scaling == "linear" and factor:
        table = dict(config.rope_parameters[FULL])
        table.update(rope_type="linear", factor=float(factor))
        config.rope_parameters = {**config.rope_parameters, FULL: table}


FAMILY = Family(
    name="gemma3",
    model_types=("gemma3_text",),
    gguf_architectures=("gemma3",),
    block=hf_block,
    rope_types=frozenset({"default", "linear"}),
    embed_scale=embed_scale,
    logit_softcap=final_softcap,
    attention=layer_types_attention,
    attn_implementation=eager_if_softcapped,
    rotary_per_layer_type=True,
    gguf_config=_gguf_config,
    gguf_rope_scalings=frozenset({"linear"}),
)
