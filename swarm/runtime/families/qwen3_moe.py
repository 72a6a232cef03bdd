"""Qwen3-MoE: Qwen3's attention (q and k RMS-normed per head) with a sparse MLP in every layer:
softmax over the experts, the top k, rescaled to sum to 1 where `norm_topk_prob` says so
(transformers' Qwen3MoeTopKRouter; llama.cpp always rescales for this architecture)."""

from __future__ import annotations

from typing import Any

from swarm.errors import UnsupportedModelError
from swarm.runtime.families import moe
from swarm.runtime.families.family import Family, gguf_field, layer_types_attention
from swarm.runtime.families.qwen3 import gguf_head_dim


def routing(config: Any) -> moe.Routing:
    return moe.Routing(
        experts=int(config.num_experts),
        top_k=int(config.num_experts_per_tok),
        normalize=bool(config.norm_topk_prob),
        float32_weights=False,
    )


def _check(config: Any) -> None:
    moe.check_silu_experts(config)
    dense = list(getattr(config, "mlp_only_layers", None) or [])
    step = int(getattr(config, "decoder_sparse_step", 1) or 1)
    if dense or step != 1 or int(config.num_experts) < 1:
        raise UnsupportedModelError(
            f"model type {config.model_type!r} with dense layers among the sparse ones "
            f"(mlp_only_layers {dense}, decoder_sparse_step {step}) is not supported; the "
            "qwen3_moe adapter implements experts in every layer"
        )


def _gguf_config(config: Any, reader: Any) -> None:
    moe.check_no_shared_experts(config, reader, "qwen3moe")
    gguf_head_dim(config, reader, "qwen3moe")
    # transformers' GGUF reader leaves these at the config class defaults
    config.moe_intermediate_size = int(gguf_field(reader, "qwen3moe.expert_feed_forward_length"))
    config.norm_topk_prob = True  # llama.cpp rescales the top k for qwen3moe


FAMILY = Family(
    name="qwen3_moe",
    model_types=("qwen3_moe",),
    gguf_architectures=("qwen3moe",),
    block=moe.moe_block(routing),
    attention=layer_types_attention,
    gguf_config=_gguf_config,
    check=_check,
    layer_params=moe.per_expert_params,
)
