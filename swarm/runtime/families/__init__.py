"""Model families. Each module registers one `Family`: parameter names and skeleton paths,
embedding and logit processing, per-layer attention kind and rotary table, GGUF quirks, and the
decoder-layer block (transformers' own layer, or a lean forward that is bit-identical to it).
Adding a family is one module here, one line in `REGISTERED`, and its test (docs/families.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from swarm.errors import UnsupportedModelError
from swarm.runtime.families import (
    gemma2,
    gemma3,
    generic,
    gpt_oss,
    llama,
    mistral,
    mixtral,
    phi3,
    qwen2,
    qwen3,
    qwen3_moe,
)
from swarm.runtime.families.family import (
    AttentionKind,
    BatchedBlock,
    Block,
    Family,
    SkeletonPaths,
)
from swarm.runtime.weights.packed import Source

__all__ = [
    "GGUF_CONFIGS",
    "REGISTERED",
    "AttentionKind",
    "BatchedBlock",
    "Block",
    "Family",
    "SkeletonPaths",
    "UnsupportedModelError",
    "build_block",
    "config_from_gguf",
    "family_for",
    "refuse_gguf_architecture",
]

REGISTERED: tuple[Family, ...] = (
    llama.FAMILY,
    mistral.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    gemma2.FAMILY,
    gemma3.FAMILY,
    phi3.FAMILY,
    qwen3_moe.FAMILY,
    mixtral.FAMILY,
    gpt_oss.FAMILY,
    generic.FAMILY,
)

# Mixture-of-experts variants no adapter implements, by model type and by GGUF architecture:
# refused by name rather than run with a part of the model missing.
_NOT_SUPPORTED = {
    "qwen2_moe": "its shared expert is not implemented",
    "deepseek_v2": "its shared experts and grouped routing are not implemented",
    "deepseek_v3": "its shared experts and grouped routing are not implemented",
}
_GGUF_NOT_SUPPORTED = {"qwen2moe": "qwen2_moe", "deepseek2": "deepseek_v2"}
# GGUF architectures whose config the family builds from the file's fields (transformers'
# GGUF reader fails on them): architecture -> (gguf reader) -> config
GGUF_CONFIGS: dict[str, Callable[[Any], Any]] = {"gpt-oss": gpt_oss.config_from_gguf}


def supported_model_types() -> list[str]:
    return sorted(t for family in REGISTERED for t in family.model_types)


def family_for(config: Any) -> Family:
    """The family serving this config, after checking it uses only what the adapter
    implements; UnsupportedModelError (one line) otherwise."""
    model_type = str(getattr(config, "model_type", "") or "")
    _refuse_variant(model_type)
    for family in REGISTERED:
        if model_type in family.model_types:
            family.validate(config)
            return family
    raise UnsupportedModelError(
        f"model type {model_type or '(none)'!r} is not supported; supported model types: "
        f"{', '.join(supported_model_types())}"
    )


def _refuse_variant(model_type: str) -> None:
    reason = _NOT_SUPPORTED.get(model_type)
    if reason is not None:
        raise UnsupportedModelError(f"model family {model_type!r} (mixture of experts): {reason}")


def refuse_gguf_architecture(architecture: str) -> None:
    """Refuse a GGUF file of a known mixture-of-experts variant before reading anything else
    (its tensor types, which may be ones swarm has no blocks for)."""
    model_type = _GGUF_NOT_SUPPORTED.get(architecture)
    if model_type is not None:
        _refuse_variant(model_type)


def config_from_gguf(config: Any, reader: Any) -> Any:
    """The config transformers built from a GGUF file, as the class of the family that runs
    it (a llama-architecture file with experts is a Mixtral)."""
    return mixtral.config_from_gguf(config, reader)


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
