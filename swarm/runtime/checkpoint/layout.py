"""How a decoder-only checkpoint splits into parts: the embedding, one part per decoder layer,
and the head (final norm + lm_head). Where each lives in the checkpoint's parameter names is
the family's `SkeletonPaths`. Names inside a part are the same for every family (a layer's
relative to the layer, so its file does not depend on its index; `embed_tokens.*`, `norm.*`
and `lm_head.*` for the rest), so the runtime reads a part without knowing the family's tree."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from swarm.errors import ModelError
from swarm.runtime.families.family import Shapes, SkeletonPaths

EMBED = "embed"
HEAD = "head"
# the names the embedding, final norm and head go by inside their parts
EMBED_NAME = "embed_tokens"
NORM_NAME = "norm"
HEAD_NAME = "lm_head"


def layer_part(index: int) -> str:
    return f"layer-{index:04d}"


def part_file(part: str) -> str:
    return f"{part}.safetensors"


def split_name(hf_name: str, paths: SkeletonPaths) -> tuple[str, str] | None:
    """Map a Hugging Face parameter name to (part, name inside the part), or None if unknown."""
    layers = f"{paths.layers}."
    if hf_name.startswith(layers):
        index, dot, rest = hf_name[len(layers) :].partition(".")
        return (layer_part(int(index)), rest) if index.isdigit() and dot and rest else None
    for path, part, inner in (
        (paths.embedding, EMBED, EMBED_NAME),
        (paths.norm, HEAD, NORM_NAME),
        (paths.head, HEAD, HEAD_NAME),
    ):
        if hf_name.startswith(f"{path}."):
            return part, f"{inner}.{hf_name[len(path) + 1 :]}"
    return None


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


def layout_from_config(
    config: Any,
    paths: SkeletonPaths,
    layer_params: Callable[[Any, Shapes], Shapes] = lambda config, shapes: shapes,
) -> ModelLayout:
    """`layer_params`: the family's names and shapes of a layer part, from the skeleton's."""
    skeleton = build_skeleton(config)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    parts: dict[str, Shapes] = {}
    for hf_name, tensor in skeleton.state_dict().items():
        where = split_name(hf_name, paths)
        if where is None:
            raise ModelError(
                f"unsupported model layout: parameter {hf_name!r} is not in the embedding "
                f"({paths.embedding}), a decoder layer ({paths.layers}.N), the final norm "
                f"({paths.norm}) or the head ({paths.head})"
            )
        part, name = where
        if tied and name == f"{HEAD_NAME}.weight":
            continue  # the head reuses the embedding matrix
        parts.setdefault(part, {})[name] = tuple(tensor.shape)
    parts = {p: layer_params(config, s) if p.startswith("layer-") else s for p, s in parts.items()}
    num_layers = int(config.num_hidden_layers)
    missing = [
        p for p in (EMBED, HEAD, *[layer_part(i) for i in range(num_layers)]) if p not in parts
    ]
    if missing:
        raise ModelError(f"unsupported model layout: no parameters for {', '.join(missing)}")
    return ModelLayout(num_layers=num_layers, tie_word_embeddings=tied, parts=parts)
