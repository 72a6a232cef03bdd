"""Mixture-of-experts decoder layers (Qwen3-MoE, Mixtral): the lean block's attention and norms
(`llama.LlamaBlock`: Llama's attention, with Qwen3's q and k norms where the layer has them),
and a sparse feed-forward whose experts stay as the checkpoint stores them.

A layer part keeps one matrix per expert and projection (`mlp.experts.{e}.gate_proj.weight`,
`up_proj`, `down_proj`, as Hugging Face folders store them; a GGUF file's 3-D
`ffn_*_exps` tensors are cut into the same per-expert slices of their blocks), so a quantized
expert runs on the weights layer's products for its type and no expert is ever dequantized
whole. A step computes only the experts its rows route to, each once for all the rows that
chose it (a prefill, or a batch of decode sessions), in ascending expert order as
transformers sums them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from swarm.errors import ModelError, UnsupportedModelError
from swarm.runtime.families import llama
from swarm.runtime.families.family import Block, Shapes, gguf_field
from swarm.runtime.families.generic import HFBlock
from swarm.runtime.kv_cache import SessionKV
from swarm.runtime.weights.packed import Matrices, Source
from swarm.runtime.weights.quant import Weight, linear
from swarm.runtime.weights.routed import ExpertRouting, NativeExperts

ROUTER = "mlp.gate.weight"
_FUSED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")  # transformers' 3-D parameters


def expert_name(expert: int, projection: str) -> str:
    """The part's name of one expert's matrix; projection: gate, up or down."""
    return f"mlp.experts.{expert}.{projection}_proj.weight"


def per_expert_params(config: Any, shapes: Shapes) -> Shapes:
    """A layer part's parameters: transformers' 3-D expert tensors as a matrix per expert."""
    if not all(name in shapes for name in _FUSED):
        return shapes
    experts, double, hidden = shapes[_FUSED[0]]
    inner = double // 2
    out = {name: shape for name, shape in shapes.items() if name not in _FUSED}
    for e in range(experts):
        out[expert_name(e, "gate")] = (inner, hidden)
        out[expert_name(e, "up")] = (inner, hidden)
        out[expert_name(e, "down")] = (hidden, inner)
    return out


@dataclass(frozen=True)
class Routing:
    """How a family picks and weighs its experts: softmax over all experts, the top k."""

    experts: int
    top_k: int
    normalize: bool  # the top k probabilities rescaled to sum to 1
    float32_weights: bool  # Mixtral weighs in float32; Qwen3-MoE in the logits' dtype


class RoutedRun:
    """What a sparse MLP says of its steps (Qwen3-MoE's and Mixtral's, gpt-oss's). On torch's
    path a row's router logits come from a float product whose sums depend on the number of
    rows, so rows that come together are not computed alone (`feed_forward.FeedForward`)."""

    native: NativeExperts | None  # the whole step as one call of swarm's kernels, where built
    _last: tuple[int, ...] | torch.Tensor  # the experts the last call ran, or chose [rows, k]

    @property
    def rows_alone(self) -> bool:
        """Whether each row is routed and computed alone, the same bits in any batch."""
        return self.native is not None

    def record(self, chosen: torch.Tensor) -> None:
        """The experts a call elsewhere (a whole layer's) chose, [rows, top_k]."""
        self._last = chosen

    @property
    def last_experts(self) -> tuple[int, ...]:
        """The experts the last call ran, ascending."""
        if isinstance(self._last, torch.Tensor):
            return tuple(sorted(set(self._last.flatten().tolist())))
        return self._last


class SparseExperts(RoutedRun, torch.nn.Module):
    """Stands in for the layer's sparse MLP module; holds no parameters of its own (the
    layer's state_dict stays its attention's and norms')."""

    def __init__(self, routing: Routing, weights: dict[str, Source], matrices: Matrices) -> None:
        super().__init__()
        self.routing = routing
        router = weights[ROUTER]
        # routing is a discrete choice: a float router keeps its float weights, even in int8
        self.router: Weight = (
            router if isinstance(router, torch.Tensor) else matrices.fused([router])
        )
        experts = range(routing.experts)
        self.gate_up = [
            matrices.fused([weights[expert_name(e, "gate")], weights[expert_name(e, "up")]])
            for e in experts
        ]
        self.down = [matrices.fused([weights[expert_name(e, "down")]]) for e in experts]
        # where every matrix runs on swarm's kernels, the whole step is one call of them
        self.native = NativeExperts.build(
            self.router,
            self.gate_up,
            self.down,
            ExpertRouting(top_k=routing.top_k, normalize=routing.normalize),
        )
        self._last: tuple[int, ...] | torch.Tensor = ()  # what the last call ran or chose

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [batch, seq, hidden] -> rows [tokens, hidden]
        rows = hidden.reshape(-1, hidden.shape[-1])
        if self.native is not None and rows.dtype == torch.float32:
            out, self._last = self.native(rows)
            return out.view(hidden.shape)
        logits = linear(rows, self.router)  # [tokens, experts]
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        top, chosen = torch.topk(probs, self.routing.top_k, dim=-1)  # [tokens, k]
        if self.routing.normalize:
            top = top / top.sum(dim=-1, keepdim=True)
        if not self.routing.float32_weights:
            top = top.to(logits.dtype)
        out = torch.zeros_like(rows)
        hit = torch.unique(chosen).tolist()  # ascending: the order transformers adds them in
        for e in hit:
            token, slot = torch.where(chosen == e)
            gate, up = linear(rows[token], self.gate_up[e]).chunk(2, dim=-1)
            part = linear(F.silu(gate) * up, self.down[e]) * top[token, slot, None]
            out.index_add_(0, token, part.to(out.dtype))
        self._last = tuple(hit)
        return out.view(hidden.shape)


def _split(weights: dict[str, Source]) -> tuple[dict[str, Source], dict[str, Source]]:
    """A layer's weights: its sparse MLP's, and the rest."""
    mlp = {k: v for k, v in weights.items() if k.startswith("mlp.")}
    return mlp, {k: v for k, v in weights.items() if k not in mlp}


def _device(weights: dict[str, Source]) -> torch.device:
    return next(v.device for v in weights.values() if isinstance(v, torch.Tensor))


class MoEBlock(llama.LlamaBlock):
    """The lean block with `SparseExperts` as its feed-forward."""

    def __init__(
        self,
        config: Any,
        index: int,
        routing: Routing,
        weights: dict[str, Source],
        int8: bool,
    ) -> None:
        mlp, rest = _split(weights)
        experts = SparseExperts(routing, mlp, Matrices(_device(weights), int8))
        super().__init__(config, index, rest, int8, mlp=experts)

    @property
    def experts(self) -> SparseExperts:
        if not isinstance(self.mlp, SparseExperts):
            raise ModelError("a mixture-of-experts layer lost its experts")
        return self.mlp

    def _feed_forward_described(self) -> llama.DescribedFeedForward | None:
        native = self.experts.native
        if native is None:
            return None
        return llama.DescribedFeedForward([], [], 0, native.described, native.top_k)

    def _routed(self, chosen: torch.Tensor) -> None:
        self.experts.record(chosen)


class HFMoEBlock(HFBlock):
    """transformers' decoder layer with its sparse MLP replaced by `SparseExperts`: for a
    config whose attention the lean block does not implement."""

    def __init__(
        self,
        layer: torch.nn.Module,  # on the meta device
        routing: Routing,
        weights: dict[str, Source],
        int8: bool,
    ) -> None:
        mlp, rest = _split(weights)
        layer.mlp = SparseExperts(routing, mlp, Matrices(_device(weights), int8))
        super().__init__(layer, rest, int8)

    @property
    def experts(self) -> SparseExperts:
        mlp = self._layer.mlp
        if not isinstance(mlp, SparseExperts):
            raise ModelError("a mixture-of-experts layer lost its experts")
        return mlp

    def decode_batch(
        self,
        hidden: torch.Tensor,  # [sessions, 1, hidden]
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        caches: list[SessionKV],
    ) -> torch.Tensor:
        """One decode position for each of several sessions: attention per session on its
        own cache, then the experts once for all of them, grouped by expert."""
        layer = self._layer
        attention, input_norm, post_norm = (
            layer.get_submodule(name)
            for name in ("self_attn", "input_layernorm", "post_attention_layernorm")
        )
        cos, sin = position_embeddings
        attended = []
        for i, cache in enumerate(caches):
            row = hidden[i : i + 1]
            attn, _ = attention(
                hidden_states=input_norm(row),
                attention_mask=None,
                cache=cache,
                use_cache=True,
                position_embeddings=(cos[i : i + 1], sin[i : i + 1]),
            )
            attended.append(row + attn)
        joined = torch.cat(attended)
        out: torch.Tensor = joined + self.experts(post_norm(joined))
        return out


def runs_lean(config: Any) -> bool:
    """Whether the lean block runs the layer's attention as transformers' Qwen3MoeAttention
    or MixtralAttention does (Llama's; Qwen3-MoE adds its q and k norms)."""
    return llama.attention_supported(config)


def moe_block(routing_of: Callable[[Any], Routing]) -> Callable[..., Block]:
    def build(
        config: Any, layer: torch.nn.Module, index: int, weights: dict[str, Source], int8: bool
    ) -> Block:
        if runs_lean(config):
            return MoEBlock(config, index, routing_of(config), weights, int8)
        return HFMoEBlock(layer, routing_of(config), weights, int8)

    return build


def check_silu_experts(config: Any) -> None:
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(
            f"model type {config.model_type!r}: experts with activation {act!r} are not "
            "supported; the mixture-of-experts adapter implements silu"
        )


def check_no_shared_experts(config: Any, reader: Any, architecture: str) -> None:
    """A GGUF file of an architecture swarm runs, but with shared experts, is refused."""
    shared = gguf_field(reader, f"{architecture}.expert_shared_count")
    if shared:
        raise UnsupportedModelError(
            f"model type {config.model_type!r}: a GGUF file with {shared} shared experts is "
            "not supported; the mixture-of-experts adapter implements routed experts only"
        )
    gating = gguf_field(reader, f"{architecture}.expert_gating_func")
    if gating not in (None, 1):  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX
        raise UnsupportedModelError(
            f"model type {config.model_type!r}: GGUF expert gating function {gating} is not "
            "supported; the mixture-of-experts adapter implements softmax"
        )
