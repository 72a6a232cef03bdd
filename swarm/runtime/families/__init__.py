"""Model families. Each module registers one `Family`: parameter names and skeleton paths,
embedding and logit processing, per-layer attention kind and rotary table, GGUF quirks, and the
decoder-layer block (transformers' own layer, or a lean forward that is bit-identical to it).
Adding a family is one module here, one line in `REGISTERED`, and its test (docs/families.md)."""

from __future__ import annotations

from typing import Any

import torch

from swarm.errors import UnsupportedModelError
from swarm.runtime.families import gemma2, gemma3, generic, llama, mistral, phi3, qwen2, qwen3
from swarm.runtime.families.family import (
    AttentionKind,
    Block,
    Family,
    SkeletonPaths,
)
from swarm.runtime.weights.packed import Source

__all__ = [
    "REGISTERED",
    "AttentionKind",
    "Block",
    "Family",
    "SkeletonPaths",
    "UnsupportedModelError",
    "build_block",
    "family_for",
]

REGISTERED: tuple[Family, ...] = (
    llama.FAMILY,
    mistral.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    gemma2.FAMILY,
    gemma3.FAMILY,
    phi3.FAMILY,
    generic.FAMILY,
)


def supported_model_types() -> list[str]:
    return sorted(t for family in REGISTERED for t in family.model_types)


def family_for(config: Any) -> Family:
    """The family serving this config, after checking it uses only what the adapter
    implements; UnsupportedModelError (one line) otherwise."""
    model_type = str(getattr(config, "model_type", "") or "")
    for family in REGISTERED:
        if model_type in family.model_types:
            family.validate(config)
            return family
    raise UnsupportedModelError(
        f"model type {model_type or '(none)'!r} is not supported; supported model types: "
        f"{', '.join(supported_model_types())}"
    )


def build_block(
    config: Any,
    skeleton: torch.nn.Module,
    index: int,
    weights: dict[str, Source],
    int8: bool = False,
) -> Block:
    """Weights already have the target float dtype and device; `int8` quantizes the layer's
    matrices (swarm.runtime.weights.quant) and keeps norms and biases as they are."""
    family = family_for(config)
    return family.block(config, family.paths.layer(skeleton, index), index, weights, int8)
