"""gpt-oss, from Hugging Face folders of float weights and from GGUF files: transformers' own
attention (a learned sink per head, eager; sliding and full layers alternating; YaRN rotary)
and norms, and swarm's sparse MLP: the router's logits with their bias, the top k, a softmax
over those k; each chosen expert's gate and up, gate clamped above and up on both sides at
`swiglu_limit`, (up + 1) * gate * sigmoid(alpha * gate), then down (transformers'
GptOssExperts, the same products in the same order).

A folder's layer part keeps the experts as transformers does (one 3-D float tensor per
projection, x @ W + b, gate and up interleaved columns); a GGUF file's is cut per expert
(gate and up apart, as llama.cpp writes them, with their biases) and runs in the file's own
type (MXFP4 on its block kernel). Either way a step computes only the experts its rows route
to. A folder of MXFP4 experts (the published checkpoints' `quantization_config`) is refused:
not supported yet."""

from __future__ import annotations

from typing import Any

import torch

from swarm.errors import ModelError, UnsupportedModelError
from swarm.runtime.families import moe
from swarm.runtime.families.family import Family, Shapes, gguf_field, layer_types_attention
from swarm.runtime.families.generic import HFBlock
from swarm.runtime.weights.packed import Matrices, Source
from swarm.runtime.weights.quant import Int8Weight, Weight, linear
from swarm.runtime.weights.routed import ExpertBiases, ExpertRouting, NativeExperts

_ALPHA = 1.702  # transformers' GptOssExperts: gate * sigmoid(1.702 * gate)
_EXPERTS = "mlp.experts"
ROUTER = "mlp.router.weight"
ROUTER_BIAS = "mlp.router.bias"


class GptOssExperts(moe.RoutedRun, torch.nn.Module):
    """Stands in for the layer's GptOssMLP (returns its output and the top-k weights, as that
    module does); holds no parameters of its own."""

    def __init__(self, config: Any, weights: dict[str, Source], int8: bool) -> None:
        super().__init__()
        self.top_k = int(config.num_experts_per_tok)
        self.limit = float(config.swiglu_limit)
        self.alpha = float(getattr(config, "swiglu_alpha", _ALPHA) or _ALPHA)
        self.router = _float(ROUTER, weights[ROUTER])
        self.router_bias = _float(ROUTER_BIAS, weights[ROUTER_BIAS])
        self._last: tuple[int, ...] | torch.Tensor = ()  # what the last call ran or chose
        experts = int(config.num_local_experts)
        self.per_expert: list[tuple[Weight, torch.Tensor, Weight, torch.Tensor]] | None = None
        self.native: NativeExperts | None = None
        if moe.expert_name(0, "gate") in weights:  # a GGUF file's layout: a matrix per expert
            self.per_expert = [
                _expert(weights, e, Matrices(self.router.device, int8)) for e in range(experts)
            ]
            # where every matrix runs on swarm's kernels, the whole step is one call of them
            self.native = NativeExperts.build(
                self.router,
                [e[0] for e in self.per_expert],
                [e[2] for e in self.per_expert],
                ExpertRouting(
                    top_k=self.top_k,
                    normalize=False,
                    softmax_first=False,
                    clamped=True,
                    alpha=self.alpha,
                    limit=self.limit,
                ),
                ExpertBiases(
                    router=self.router_bias,
                    gate_up=[e[1] for e in self.per_expert],
                    down=[e[3] for e in self.per_expert],
                ),
            )
            return
        floats = {k: _float(k, v) for k, v in weights.items()}
        # int8: each expert's matrices as per-row int8, [out, in] as linear takes them
        self.int8 = (
            [
                (
                    Int8Weight.quantize(floats["mlp.experts.gate_up_proj"][e].T.contiguous()),
                    Int8Weight.quantize(floats["mlp.experts.down_proj"][e].T.contiguous()),
                )
                for e in range(experts)
            ]
            if int8
            else None
        )
        self.gate_up = floats["mlp.experts.gate_up_proj"]  # [experts, hidden, 2 * inner]
        self.gate_up_bias = floats["mlp.experts.gate_up_proj_bias"]  # [experts, 2 * inner]
        self.down = floats["mlp.experts.down_proj"]  # [experts, inner, hidden]
        self.down_bias = floats["mlp.experts.down_proj_bias"]  # [experts, hidden]

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's output and, as transformers' module returns, the routing: its top-k
        weights on torch's path, the chosen experts on the kernels' (the layer ignores it)."""
        rows = hidden.reshape(-1, hidden.shape[-1])  # [tokens, hidden]
        if self.native is not None and rows.dtype == torch.float32:
            out, self._last = self.native(rows)
            return out.view(hidden.shape), self._last
        logits = torch.nn.functional.linear(rows, self.router, self.router_bias)
        top, chosen = torch.topk(logits, self.top_k, dim=-1)  # [tokens, k]
        weights = torch.nn.functional.softmax(top, dim=1, dtype=top.dtype)
        out = torch.zeros_like(rows)
        hit = torch.unique(chosen).tolist()  # ascending, as transformers adds them
        for e in hit:
            token, slot = torch.where(chosen == e)
            gate, up = self._gate_up(rows[token], e)
            gate = gate.clamp(min=None, max=self.limit)
            up = up.clamp(min=-self.limit, max=self.limit)
            glu = gate * torch.sigmoid(gate * self.alpha)
            part = self._down((up + 1) * glu, e)
            out.index_add_(0, token, (part * weights[token, slot, None]).to(out.dtype))
        self._last = tuple(hit)
        return out.view(hidden.shape), weights

    def _gate_up(self, x: torch.Tensor, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Gate and up of expert e: interleaved columns in transformers' layout, apart in
        a GGUF file's (llama.cpp's converter de-interleaves them)."""
        if self.per_expert is not None:
            gate, up = linear(x, self.per_expert[e][0], self.per_expert[e][1]).chunk(2, dim=-1)
            return gate, up
        if self.int8 is not None:
            both = linear(x, self.int8[e][0], self.gate_up_bias[e])
        else:
            both = x @ self.gate_up[e] + self.gate_up_bias[e]
        return both[..., ::2], both[..., 1::2]

    def _down(self, x: torch.Tensor, e: int) -> torch.Tensor:
        if self.per_expert is not None:
            return linear(x, self.per_expert[e][2], self.per_expert[e][3])
        if self.int8 is not None:
            return linear(x, self.int8[e][1], self.down_bias[e])
        return x @ self.down[e] + self.down_bias[e]


class GptOssBlock(HFBlock):
    def __init__(
        self, config: Any, layer: torch.nn.Module, weights: dict[str, Source], int8: bool
    ) -> None:
        mlp = {k: v for k, v in weights.items() if k.startswith("mlp.")}
        layer.mlp = GptOssExperts(config, mlp, int8)
        rest = {k: v for k, v in weights.items() if k not in mlp}
        super().__init__(layer, rest, int8, additive_mask=True)


def gpt_oss_block(
    config: Any, layer: torch.nn.Module, index: int, weights: dict[str, Source], int8: bool
) -> GptOssBlock:
    return GptOssBlock(config, layer, weights, int8)


def _expert(
    weights: dict[str, Source], e: int, matrices: Matrices
) -> tuple[Weight, torch.Tensor, Weight, torch.Tensor]:
    """Expert e of a GGUF file: gate and up as one matrix (its outputs gate, then up) and
    their biases, down and its bias; matrices in the file's own type."""

    def bias(projection: str) -> torch.Tensor:
        name = moe.expert_name(e, projection).removesuffix(".weight") + ".bias"
        return _float(name, weights[name])

    gate_up = matrices.fused(
        [weights[moe.expert_name(e, "gate")], weights[moe.expert_name(e, "up")]]
    )
    down = matrices.fused([weights[moe.expert_name(e, "down")]])
    return gate_up, torch.cat([bias("gate"), bias("up")]), down, bias("down")


def per_expert_params(config: Any, shapes: Shapes) -> Shapes:
    """A GGUF file's layer: each expert's gate, up and down matrices and biases."""
    experts, hidden, double = shapes[f"{_EXPERTS}.gate_up_proj"]
    inner = double // 2
    out = {k: v for k, v in shapes.items() if not k.startswith(f"{_EXPERTS}.")}
    for e in range(experts):
        for projection, shape in (("gate", (inner, hidden)), ("up", (inner, hidden))):
            out[moe.expert_name(e, projection)] = shape
            out[moe.expert_name(e, projection).removesuffix(".weight") + ".bias"] = (inner,)
        out[moe.expert_name(e, "down")] = (hidden, inner)
        out[moe.expert_name(e, "down").removesuffix(".weight") + ".bias"] = (hidden,)
    return out


def config_from_gguf(reader: Any) -> Any:
    """A gpt-oss GGUF file's config, from its fields (what llama.cpp reads; transformers'
    reader fails on the file's rope scaling fields)."""
    from transformers import GptOssConfig

    def field(key: str, default: Any = None) -> Any:
        value = gguf_field(reader, f"gpt-oss.{key}")
        return default if value is None else value

    tokens = gguf_field(reader, "tokenizer.ggml.tokens") or []
    heads = int(field("attention.head_count"))
    hidden = int(field("embedding_length"))
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(field("rope.freq_base"))}
    if field("rope.scaling.type") == "yarn":
        rope.update(  # beta_fast, beta_slow and truncate: llama.cpp's and the release's
            rope_type="yarn",
            factor=float(field("rope.scaling.factor")),
            original_max_position_embeddings=int(field("rope.scaling.original_context_length")),
            beta_fast=32.0,
            beta_slow=1.0,
            truncate=False,
        )
    return GptOssConfig(
        vocab_size=int(field("vocab_size", len(tokens))),
        hidden_size=hidden,
        intermediate_size=int(field("expert_feed_forward_length")),
        num_hidden_layers=int(field("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(field("attention.head_count_kv", heads)),
        head_dim=int(field("attention.key_length", hidden // heads)),
        max_position_embeddings=int(field("context_length")),
        rms_norm_eps=float(field("attention.layer_norm_rms_epsilon")),
        sliding_window=int(field("attention.sliding_window", 128)),
        num_local_experts=int(field("expert_count")),
        num_experts_per_tok=int(field("expert_used_count")),
        rope_parameters=rope,
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        bos_token_id=gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=gguf_field(reader, "tokenizer.ggml.eos_token_id"),
        pad_token_id=gguf_field(reader, "tokenizer.ggml.padding_token_id"),
    )


def _gguf_config(config: Any, reader: Any) -> None:
    moe.check_no_shared_experts(config, reader, "gpt-oss")
    # transformers' GGUF reader leaves these at the config class defaults
    for key, attribute in (
        ("attention.key_length", "head_dim"),
        ("expert_feed_forward_length", "intermediate_size"),
    ):
        value = gguf_field(reader, f"gpt-oss.{key}")
        if value:
            setattr(config, attribute, int(value))


def _float(name: str, weight: Source) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor):
        raise ModelError(f"gpt-oss expert tensor {name} must be float, not quantized")
    return weight


def _check(config: Any) -> None:
    quantized = getattr(config, "quantization_config", None)
    if quantized:
        method = quantized.get("quant_method") if isinstance(quantized, dict) else quantized
        raise UnsupportedModelError(
            f"model type {config.model_type!r} with {method} experts is not supported yet; "
            "the gpt_oss adapter runs float folders"
        )


FAMILY = Family(
    name="gpt_oss",
    model_types=("gpt_oss",),
    gguf_architectures=("gpt-oss",),
    block=gpt_oss_block,
    rope_types=frozenset({"default", "yarn"}),
    attention=layer_types_attention,
    attn_implementation=lambda config: "eager",  # the sinks: SDPA has no such term
    check=_check,
    gguf_config=_gguf_config,
    gguf_rope_scalings=frozenset({"yarn"}),
    gguf_layer_params=per_expert_params,
)
