"""Gemma-2: embeddings scaled by sqrt(hidden_size), norms of the form (1 + w) (stored as w + 1
in GGUF), sliding and full layers alternating, attention and final logits soft-capped. The
attention soft-cap needs eager attention: SDPA has no such term."""

from __future__ import annotations

import math
from typing import Any

from swarm.runtime.families.family import Family, gguf_field, layer_types_attention
from swarm.runtime.families.generic import hf_block


def embed_scale(config: Any) -> float:
    return math.sqrt(int(config.hidden_size))


def eager_if_softcapped(config: Any) -> str:
    return "eager" if getattr(config, "attn_logit_softcapping", None) else "sdpa"


def final_softcap(config: Any) -> float | None:
    return getattr(config, "final_logit_softcapping", None)


def attention_scalar_from_gguf(config: Any, large_layers: int) -> None:
    """GGUF has no query_pre_attn_scalar: llama.cpp scales by the head size, except for the
    27B models (told apart by their layer count), which scale by hidden_size / heads."""
    if int(config.num_hidden_layers) == large_layers:
        config.query_pre_attn_scalar = int(config.hidden_size) // int(config.num_attention_heads)
    else:
        config.query_pre_attn_scalar = int(config.head_dim)


def _gguf_config(config: Any, reader: Any) -> None:
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = gguf_field(reader, f"gemma2.{key}")
        setattr(config, key, float(value) if value is not None else None)
    attention_scalar_from_gguf(config, large_layers=46)


FAMILY = Family(
    name="gemma2",
    model_types=("gemma2",),
    gguf_architectures=("gemma2",),
    block=hf_block,
    embed_scale=embed_scale,
    logit_softcap=final_softcap,
    attention=layer_types_attention,
    attn_implementation=eager_if_softcapped,
    gguf_config=_gguf_config,
)
