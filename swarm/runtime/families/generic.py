"""Any Hugging Face decoder layer, run as the library defines it, and the registration that
uses it alone.

Scope, honestly: the generic registration serves model types whose checkpoints need nothing
but transformers' own decoder layer and rotary table, the module tree of `SkeletonPaths`'s
defaults, full causal attention in every layer and no embedding or logit processing.
Families that differ in any of these (and every family we test) have their own module; a model
type no module registers is refused at load rather than guessed at."""

from __future__ import annotations

from typing import Any

import torch

from swarm.runtime.families.family import Family
from swarm.runtime.kv_cache import SessionKV
from swarm.runtime.weights.packed import Matrices, Source, install_packed
from swarm.runtime.weights.quant import quantize_linears


def materialize(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    """Give a meta-device module real weights; names and shapes must match exactly."""
    module.load_state_dict(weights, strict=True, assign=True)
    return module.eval()


def submodule(skeleton: torch.nn.Module, path: str) -> Any:
    return skeleton.get_submodule(path)


class HFBlock:
    def __init__(
        self,
        layer: torch.nn.Module,  # on the meta device: filled here
        weights: dict[str, Source],
        int8: bool = False,
        additive_mask: bool = False,
    ) -> None:
        device = next(v.device for v in weights.values() if isinstance(v, torch.Tensor))
        floats = install_packed(layer, weights, Matrices(device, int8))
        self._layer = materialize(layer, floats)
        if int8:
            quantize_linears(self._layer)
        # eager attention adds its mask to the scores: it takes 0 / -inf, not True / False
        self._additive = additive_mask

    def __call__(
        self,
        hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: SessionKV,
    ) -> torch.Tensor:
        if self._additive and attention_mask is not None:
            blocked = torch.finfo(hidden.dtype).min
            attention_mask = torch.zeros(
                attention_mask.shape, dtype=hidden.dtype, device=hidden.device
            ).masked_fill(~attention_mask, blocked)
        out = self._layer(
            hidden,
            attention_mask=attention_mask,
            cache=cache,
            use_cache=True,
            position_embeddings=position_embeddings,
        )
        hidden_out: torch.Tensor = out[0] if isinstance(out, tuple) else out
        return hidden_out


def hf_block(
    config: Any,
    layer: torch.nn.Module,
    index: int,
    weights: dict[str, Source],
    int8: bool,
) -> HFBlock:
    eager = getattr(config, "_attn_implementation", "sdpa") == "eager"
    return HFBlock(layer, weights, int8, additive_mask=eager)


# No checkpoint in the test matrix needs it yet; a model type proven to fit the scope above is
# added here together with its test.
FAMILY = Family(name="generic", model_types=(), gguf_architectures=(), block=hf_block)
