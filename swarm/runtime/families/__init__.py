"""Decoder-layer adapters. Any Hugging Face decoder layer runs through `generic`; a family
whose hot path is worth a leaner forward gets a small adapter of its own here. An adapter must
produce bit-identical hidden states to the Hugging Face layer on the same inputs."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from swarm.runtime.kv_cache import SessionKV
from swarm.runtime.packed import Source


class Block(Protocol):
    """One decoder layer with its weights loaded."""

    def __call__(
        self,
        hidden: torch.Tensor,  # [batch, seq, hidden]
        position_embeddings: tuple[torch.Tensor, torch.Tensor],  # cos, sin: [batch, seq, head_dim]
        attention_mask: torch.Tensor | None,  # bool [batch, 1, seq, kv_len], True = attend
        cache: SessionKV,
    ) -> torch.Tensor: ...


def build_block(
    config: Any,
    skeleton: torch.nn.Module,
    index: int,
    weights: dict[str, Source],
    int8: bool = False,
) -> Block:
    """Weights already have the target float dtype and device, or are GGUF blocks
    (swarm.runtime.packed) that run as they are; `int8` quantizes the layer's float matrices
    (swarm.runtime.quant) and keeps norms and biases as they are."""
    from swarm.runtime.families import generic, llama

    if llama.supports(config):
        return llama.LlamaBlock(config, index, weights, int8)
    return generic.HFBlock(skeleton, index, weights, int8)
