"""Any Hugging Face decoder layer, run as the library defines it."""

from __future__ import annotations

from typing import Any

import torch

from swarm.runtime.kv_cache import SessionKV
from swarm.runtime.packed import Matrices, Source, install_packed
from swarm.runtime.quant import quantize_linears


def materialize(module: torch.nn.Module, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    """Give a meta-device module real weights; names and shapes must match exactly."""
    module.load_state_dict(weights, strict=True, assign=True)
    return module.eval()


def decoder_layers(skeleton: torch.nn.Module) -> Any:
    return skeleton.model.layers  # type: ignore[union-attr]


class HFBlock:
    def __init__(
        self,
        skeleton: torch.nn.Module,
        index: int,
        weights: dict[str, Source],
        int8: bool = False,
    ) -> None:
        layer = decoder_layers(skeleton)[index]
        device = next(v.device for v in weights.values() if isinstance(v, torch.Tensor))
        floats = install_packed(layer, weights, Matrices(device, int8))
        self._layer = materialize(layer, floats)
        if int8:
            quantize_linears(self._layer)

    def __call__(
        self,
        hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: SessionKV,
    ) -> torch.Tensor:
        out = self._layer(
            hidden,
            attention_mask=attention_mask,
            cache=cache,
            use_cache=True,
            position_embeddings=position_embeddings,
        )
        hidden_out: torch.Tensor = out[0] if isinstance(out, tuple) else out
        return hidden_out
