"""Mixtral: Mistral's attention with a sparse MLP in every layer: softmax over the experts in
float32, the top k, always rescaled to sum to 1 (transformers' MixtralTopKRouter).

Hugging Face folders name an expert's matrices w1 (gate), w3 (up) and w2 (down) under
`block_sparse_moe`; the part stores them under the names every MoE family uses. A Mixtral
GGUF is a llama-architecture file with `llama.expert_count` set (`config_from_gguf`); it
carries no sliding window, and llama.cpp runs it with full attention, as does swarm."""

from __future__ import annotations

import re
from typing import Any

from swarm.runtime.families import moe
from swarm.runtime.families.family import Family, every_layer_windowed, gguf_field

_CHECKPOINT_EXPERT = re.compile(r"block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight")
_PROJECTIONS = {"w1": "gate", "w3": "up", "w2": "down"}


def routing(config: Any) -> moe.Routing:
    return moe.Routing(
        experts=int(config.num_local_experts),
        top_k=int(config.num_experts_per_tok),
        normalize=True,
        float32_weights=True,
    )


def part_name(name: str) -> str:
    found = _CHECKPOINT_EXPERT.fullmatch(name)
    if found:
        return moe.expert_name(int(found[1]), _PROJECTIONS[found[2]])
    if name == "block_sparse_moe.gate.weight":
        return moe.ROUTER
    return name


def config_from_gguf(config: Any, reader: Any) -> Any:
    """A llama-architecture GGUF file with experts as a Mixtral config; others unchanged."""
    experts = gguf_field(reader, "llama.expert_count")
    if config.model_type != "llama" or not experts:
        return config
    from transformers import MixtralConfig

    values = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "architectures")}
    values.update(
        num_local_experts=int(experts),
        num_experts_per_tok=int(gguf_field(reader, "llama.expert_used_count")),
        sliding_window=None,  # the file states none
    )
    return MixtralConfig(**values)


def _gguf_config(config: Any, reader: Any) -> None:
    moe.check_no_shared_experts(config, reader, "llama")
    config.sliding_window = None


FAMILY = Family(
    name="mixtral",
    model_types=("mixtral",),
    gguf_architectures=("llama",),
    block=moe.moe_block(routing),
    attention=every_layer_windowed,
    gguf_config=_gguf_config,
    check=moe.check_silu_experts,
    layer_params=moe.per_expert_params,
    part_name=part_name,
)
