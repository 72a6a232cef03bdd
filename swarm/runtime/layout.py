"""How a decoder-only checkpoint splits into parts: the embedding, one part per decoder layer,
and the head (final norm + lm_head). Names inside a part are relative to it, so a layer's file
does not depend on its index."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from swarm.errors import ModelError

EMBED = "embed"
HEAD = "head"
_LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_EMBED_PREFIX = "model."  # model.embed_tokens.weight -> embed_tokens.weight
_HEAD_NAMES = {"model.norm.weight": "norm.weight", "model.norm.bias": "norm.bias"}


def layer_part(index: int) -> str:
    return f"layer-{index:04d}"


def part_file(part: str) -> str:
    return f"{part}.safetensors"


def split_name(hf_name: str) -> tuple[str, str] | None:
    """Map a Hugging Face parameter name to (part, name inside the part), or None if unknown."""
    match = _LAYER_NAME.match(hf_name)
    if match:
        return layer_part(int(match.group(1))), match.group(2)
    if hf_name.startswith("model.embed_tokens."):
        return EMBED, hf_name[len(_EMBED_PREFIX) :]
    if hf_name in _HEAD_NAMES:
        return HEAD, _HEAD_NAMES[hf_name]
    if hf_name.startswith("lm_head."):
        return HEAD, hf_name
    return None


Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class ModelLayout:
    """Expected parameter names and shapes of every part, derived from the model's config."""

    num_layers: int
    tie_word_embeddings: bool
    parts: dict[str, Shapes]

    def layer_parts(self) -> list[str]:
        return [layer_part(i) for i in range(self.num_layers)]


def build_skeleton(config: Any) -> torch.nn.Module:
    """The model's module tree on the meta device: names, shapes and classes, no memory."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)  # type: ignore[no-any-return]
    except (ValueError, KeyError) as e:
        raise ModelError(f"unsupported model architecture {config.model_type!r}: {e}") from None


def layout_from_config(config: Any) -> ModelLayout:
    skeleton = build_skeleton(config)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    parts: dict[str, Shapes] = {}
    for hf_name, tensor in skeleton.state_dict().items():
        where = split_name(hf_name)
        if where is None:
            raise ModelError(
                f"unsupported model layout: parameter {hf_name!r} is not in an embedding, "
                "a decoder layer (model.layers.N) or the head"
            )
        part, name = where
        if tied and name == "lm_head.weight":
            continue  # the head reuses the embedding matrix
        parts.setdefault(part, {})[name] = tuple(tensor.shape)
    num_layers = int(config.num_hidden_layers)
    missing = [
        p for p in (EMBED, HEAD, *[layer_part(i) for i in range(num_layers)]) if p not in parts
    ]
    if missing:
        raise ModelError(f"unsupported model layout: no parameters for {', '.join(missing)}")
    return ModelLayout(num_layers=num_layers, tie_word_embeddings=tied, parts=parts)
