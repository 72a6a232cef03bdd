"""A lean forward for Llama-shaped decoder layers: Llama, Mistral, Qwen2 and Qwen3, and the
attention of the mixture-of-experts layers (Qwen3-MoE, Mixtral; `moe.MoEBlock`).

The same arithmetic as transformers' decoder layers with SDPA attention, so outputs are
bit-identical (tests hold this), minus the per-call plumbing (kwarg handling, attention-interface
lookup, module hooks) that costs a few hundred microseconds per layer at decode. A layer whose
products run on swarm's CPU kernels (packed or int8 weights) also takes its RMS norms and
rotary embedding from them, one call each instead of five and six torch ops; it is no longer
bit-identical to transformers there, which its products are not either.

Qwen3's q and k are RMS-normed per head after their projection and before the rotation (the
layer holds `self_attn.q_norm.weight` and `k_norm`, head_dim wide). The feed-forward is a part:
gate, up and down (`feed_forward.GatedMLP`), or a mixture-of-experts layer's routed experts."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from swarm.errors import ModelError, UnsupportedModelError
from swarm.runtime.families.family import Block, Family, gguf_field, gguf_tensor
from swarm.runtime.families.feed_forward import MLP_WEIGHTS, FeedForward, GatedMLP
from swarm.runtime.families.generic import hf_block
from swarm.runtime.kv_cache import SessionKV
from swarm.runtime.weights import native
from swarm.runtime.weights.packed import Matrices, Source
from swarm.runtime.weights.quant import linear, rows_alone
from swarm.runtime.weights.routed import describe

# Rows of several sessions' prefill chunks that share one product. More cost more on CPU than
# they save: 8 chunks of 128 rows took 1.18-1.46x as long in one product as one at a time,
# 8 of 32 rows 0.95-1.01x (`python -m bench.prefill_rows --shared-rows 1024`, benchmarks.md).
_SHARED_ROWS = 256

# Mistral, Qwen2 and Qwen3 layers are Llama's arithmetic (Qwen2 adds q/k/v biases, Qwen3 its
# q and k norms and, where attention_bias says so, biases on all four projections).
_FAMILIES = {"llama", "mistral", "qwen2", "qwen3"}


def supports(config: Any) -> bool:
    """Whether the lean block runs this family's dense layers as transformers does."""
    return (
        config.model_type in _FAMILIES
        and getattr(config, "hidden_act", "silu") == "silu"
        and not getattr(config, "mlp_bias", False)
        and attention_supported(config)
    )


def attention_supported(config: Any) -> bool:
    """Whether the lean block's attention is transformers' for this config. A sliding window
    needs nothing of the block: the shard's masks carry it (`positions.attention_mask`), and
    the block attends natively only to a step without one."""
    return getattr(config, "pretraining_tp", 1) == 1


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    x32 = x32 * torch.rsqrt(variance + eps)
    return weight * x32.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass(frozen=True)
class DescribedFeedForward:
    """A feed-forward as a whole layer's call takes it: gate/up and down as the kernels take
    them (inner: down's width), or the routed experts' layer and table (`experts`, top_k)."""

    gate_up: list[bytes]
    down: list[bytes]
    inner: int
    experts: tuple[bytes, bytes] | None = None
    top_k: int = 0


class LlamaBlock:
    """q, k and v share one matrix, as do gate and up: fewer, larger matrix-vector products.
    Each output column is still its own dot product, so the values do not change.

    `mlp`: the layer's feed-forward, when it is not gate, up and down (whose weights are then
    not among `weights`). Every weight must be one the block uses: a parameter it would leave
    out is refused, not ignored."""

    def __init__(
        self,
        config: Any,
        index: int,
        weights: dict[str, Source],
        int8: bool = False,
        mlp: FeedForward | None = None,
    ) -> None:
        self.index = index
        self.eps = float(config.rms_norm_eps)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.scaling = self.head_dim**-0.5
        w = weights
        self.input_norm = _float(w["input_layernorm.weight"])
        self.post_norm = _float(w["post_attention_layernorm.weight"])
        # int8 scales are per output row, so quantizing the fused matrices equals quantizing
        # each projection alone
        matrices = Matrices(self.input_norm.device, int8)
        self.qkv = matrices.fused([w[f"self_attn.{p}_proj.weight"] for p in "qkv"])
        biases = [w.get(f"self_attn.{p}_proj.bias") for p in "qkv"]
        self.qkv_bias = None if biases[0] is None else torch.cat([_float(b) for b in biases])
        self.o = matrices.fused([w["self_attn.o_proj.weight"]])
        o_bias = w.get("self_attn.o_proj.bias")
        self.o_bias = None if o_bias is None else _float(o_bias)
        norms = [w.get(f"self_attn.{p}_norm.weight") for p in "qk"]  # Qwen3's, per head
        self.qk_norms = None if norms == [None, None] else (_float(norms[0]), _float(norms[1]))
        self.mlp: FeedForward = GatedMLP(matrices, w) if mlp is None else mlp
        _check_all_used(index, w, mlp is None)
        self.native_steps = (
            native.available()
            and not isinstance(self.qkv, torch.Tensor)  # packed or int8, not float weights
            and self.input_norm.device.type == "cpu"
            and self.input_norm.dtype == torch.float32
        )
        self.native_attention = self.native_steps and native.decode_attention_wanted()
        # every product of the attention computes each row alone (some float matrix among
        # packed ones would not)
        self._attention_rows_alone = (
            self.native_steps and rows_alone(self.qkv) and rows_alone(self.o)
        )
        # a decode step through the whole layer as one call, where every part of it runs on
        # the kernels (None: step by step), and the experts each row routes to in it
        dense = self._describe_dense() if native.dense_layers_wanted() else None
        self._dense: bytes | None = None if dense is None else dense[0]
        self._top_k = 0 if dense is None else dense[1]

    def _describe_dense(self) -> tuple[bytes, int] | None:
        """The layer as `native.dense_decode` takes it, and its experts' top k (0: none)."""
        feed_forward = self._feed_forward_described() if self.native_attention else None
        if feed_forward is None:
            return None
        stacks = [describe(w) for w in (self.qkv, self.o)]
        vectors = [self.input_norm, self.post_norm, self.qkv_bias, self.o_bias]
        vectors += list(self.qk_norms or (None, None))
        if any(s is None or len(s) > 3 for s in stacks) or not all(
            v is None or (v.dtype == torch.float32 and v.is_contiguous()) for v in vectors
        ):
            return None
        shape = native.DenseLayerShape(
            hidden=int(self.input_norm.shape[0]),
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            inner=feed_forward.inner,
            eps=self.eps,
            scale=self.scaling,
        )
        parts = [s for s in stacks if s is not None] + [feed_forward.gate_up, feed_forward.down]
        layer = native.describe_dense_layer(parts, vectors, shape, feed_forward.experts)
        return layer, feed_forward.top_k

    def _feed_forward_described(self) -> DescribedFeedForward | None:
        """The feed-forward as a whole layer's call takes it, or None: step by step."""
        if not isinstance(self.mlp, GatedMLP):
            return None
        gate_up, down = describe(self.mlp.gate_up), describe(self.mlp.down)
        if gate_up is None or down is None or len(gate_up) > 3 or len(down) > 3:
            return None
        return DescribedFeedForward(gate_up, down, int(self.mlp.down.shape[1]))

    def _routed(self, chosen: torch.Tensor) -> None:
        """What a whole layer's call routed each row to (a mixture of experts keeps it)."""

    def _norm(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.native_steps:
            return native.rms_norm(hidden, weight, self.eps)
        return rms_norm(hidden, weight, self.eps)

    def _heads(
        self, x: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Of normed x [batch, seq, hidden]: q and k rotated, [batch, heads + kv_heads, seq,
        head_dim], and v, [batch, kv_heads, seq, head_dim]."""
        rotated = self.heads + self.kv_heads
        if self.native_steps:
            qkv = self._rotated_heads(x, position_embeddings).transpose(1, 2)
            return qkv[:, :rotated], qkv[:, rotated:]
        batch, seq, _ = x.shape
        qkv = linear(x, self.qkv, self.qkv_bias).view(batch, seq, -1, self.head_dim)
        qk = qkv[:, :, :rotated]
        if self.qk_norms is not None:  # per head, as transformers' Qwen3Attention
            q_norm, k_norm = self.qk_norms
            q = rms_norm(qk[:, :, : self.heads], q_norm, self.eps)
            qk = torch.cat((q, rms_norm(qk[:, :, self.heads :], k_norm, self.eps)), dim=2)
        qk = qk.transpose(1, 2)
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        return (qk * cos) + (_rotate_half(qk) * sin), qkv[:, :, rotated:].transpose(1, 2)

    def _rotated_heads(
        self, x: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """Of normed x [batch, seq, hidden], on swarm's kernels: q, k and v as contiguous heads
        [batch, seq, heads + 2 kv_heads, head_dim], q and k rotated in place."""
        batch, seq, _ = x.shape
        heads = linear(x, self.qkv, self.qkv_bias).view(batch, seq, -1, self.head_dim)
        rotated = self.heads + self.kv_heads
        if self.qk_norms is not None:  # each head a row of head_dim, normed in place
            q_norm, k_norm = self.qk_norms
            native.rms_norm_(heads[:, :, : self.heads], q_norm, self.eps)
            native.rms_norm_(heads[:, :, self.heads : rotated], k_norm, self.eps)
        cos, sin = position_embeddings
        native.rotate_(heads, cos, sin, rotated)
        return heads

    def __call__(
        self,
        hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: SessionKV,
    ) -> torch.Tensor:
        batch, seq, _ = hidden.shape
        if seq == 1 and attention_mask is None and self._dense_decodes(hidden, [cache]):
            return self._dense_decode(hidden, position_embeddings, [cache])
        x = self._norm(hidden, self.input_norm)
        if seq == 1 and attention_mask is None and self._decodes_natively([cache]):
            return self._after_attention(
                hidden, self._decode_attention(x, position_embeddings, [cache])
            )
        qk, v = self._heads(x, position_embeddings)
        k, v = cache.update(qk[:, self.heads :], v, self.index)
        attn = _attention(qk[:, : self.heads], k, v, attention_mask, self.scaling)
        return self._after_attention(hidden, attn.transpose(1, 2).reshape(batch, seq, -1))

    def decode_batch(
        self,
        hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        caches: list[SessionKV],
    ) -> torch.Tensor:
        """Decode positions of several sessions: hidden [rows, 1, hidden], the rows of each
        cache's step in order (one per session; a verify step's several only where
        `decodes_rows_alone`). The matrix products run once for all rows (each weight read
        once); attention runs per row on its own session's cache, up to its own position.
        Where `decodes_rows_alone`, a row's values are the bits of a one-position step alone;
        elsewhere they match up to float rounding (torch's matrix-matrix product sums in
        another order than a matrix-vector one, a router weighs experts of rows that came
        together)."""
        batch = hidden.shape[0]
        if self._dense_decodes(hidden, caches):
            return self._dense_decode(hidden, position_embeddings, caches)
        x = self._norm(hidden, self.input_norm)
        if self._decodes_natively(caches):
            return self._after_attention(
                hidden, self._decode_attention(x, position_embeddings, caches)
            )
        if batch != len(caches):
            raise ModelError("torch's attention takes one decode position per session")
        qk, values = self._heads(x, position_embeddings)
        outputs = []
        for i, cache in enumerate(caches):  # attention: [1, heads, 1, head_dim] each
            k, v = cache.update(qk[i : i + 1, self.heads :], values[i : i + 1], self.index)
            outputs.append(_attention(qk[i : i + 1, : self.heads], k, v, None, self.scaling))
        attn = torch.cat(outputs).transpose(1, 2).reshape(batch, 1, -1)
        return self._after_attention(hidden, attn)

    def prefill_batch(
        self,
        hiddens: list[torch.Tensor],
        inputs: list[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]],
        caches: list[SessionKV],
    ) -> list[torch.Tensor]:
        """Prefill chunks of several sessions, hidden [1, seq_i, hidden] each with its own
        rotary table and mask. Where products, norms, rotation and feed-forward compute each
        row alone (swarm's kernels), consecutive sessions of up to _SHARED_ROWS rows in all
        share them (each weight read once for their rows); attention runs per session on its
        own cache. Torch's products sum a row in an order that depends on how many rows come
        with it, so there each session runs alone."""
        groups: list[list[int]] = []
        rows = 0
        shared = self._rows_alone()
        for i, hidden in enumerate(hiddens):
            seq = hidden.shape[1]
            if shared and groups and rows + seq <= _SHARED_ROWS:
                groups[-1].append(i)
                rows += seq
            else:
                groups.append([i])
                rows = seq
        out: list[torch.Tensor] = []
        for group in groups:
            if len(group) == 1:
                (cos_sin, mask), i = inputs[group[0]], group[0]
                out.append(self(hiddens[i], cos_sin, mask, caches[i]))
            else:
                out += self._shared_rows(
                    [hiddens[i] for i in group],
                    [inputs[i] for i in group],
                    [caches[i] for i in group],
                )
        return out

    def _shared_rows(
        self,
        hiddens: list[torch.Tensor],
        inputs: list[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]],
        caches: list[SessionKV],
    ) -> list[torch.Tensor]:
        """Several sessions' chunks as the rows of one product each (swarm's kernels)."""
        sizes = [h.shape[1] for h in hiddens]
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]  # each session's rows
        hidden = torch.cat(hiddens, dim=1)  # [1, rows of every session, hidden]
        cos = torch.cat([cos_sin[0] for cos_sin, _ in inputs], dim=1)
        sin = torch.cat([cos_sin[1] for cos_sin, _ in inputs], dim=1)
        # heads: [1, rows, heads + 2 kv_heads, head_dim], q and k rotated
        heads = self._rotated_heads(self._norm(hidden, self.input_norm), (cos, sin))
        rotated = self.heads + self.kv_heads
        outputs = []
        parts = [heads[:, a:b] for a, b in itertools.pairwise(bounds)]
        for part, (_, mask), cache in zip(parts, inputs, caches, strict=True):
            qkv = part.transpose(1, 2)  # [1, heads + 2 kv_heads, seq, head_dim]
            k, v = cache.update(qkv[:, self.heads : rotated], qkv[:, rotated:], self.index)
            attn = _attention(qkv[:, : self.heads], k, v, mask, self.scaling)
            outputs.append(attn.transpose(1, 2).reshape(1, part.shape[1], -1))
        out = self._after_attention(hidden, torch.cat(outputs, dim=1))
        return [out[:, a:b] for a, b in itertools.pairwise(bounds)]

    def decodes_rows_alone(self, cache: SessionKV) -> bool:
        """Whether every product, norm, rotation and attention of this layer computes each row
        alone, with the same arithmetic whatever the number of rows (swarm's kernels)."""
        return self._decodes_natively([cache]) and self._rows_alone()

    def _rows_alone(self) -> bool:
        """Whether every step but attention computes each row alone (asked at each call: a
        feed-forward may change how it computes)."""
        return self._attention_rows_alone and self.mlp.rows_alone

    def _decodes_natively(self, caches: list[SessionKV]) -> bool:
        return self.native_attention and all(c.shape.dtype == torch.float32 for c in caches)

    def _dense_decodes(self, hidden: torch.Tensor, caches: list[SessionKV]) -> bool:
        return (
            self._dense is not None
            and hidden.dtype == torch.float32
            and self._decodes_natively(caches)
            and self.mlp.rows_alone  # asked at each call, as _rows_alone
        )

    def _dense_decode(
        self,
        hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        caches: list[SessionKV],
    ) -> torch.Tensor:
        """Of hidden [rows, 1, hidden] (or [1, 1, hidden]), one decode position each (each
        cache's step's rows in order): the layer's output, computed in one call
        (`native.dense_decode`) with the bits of the steps `_decode_attention` and
        `_after_attention` take."""
        batch, seq, width = hidden.shape
        rows = batch * seq
        out = hidden.reshape(rows, width).clone(memory_format=torch.contiguous_format)
        cos, sin = (
            t.expand(batch, seq, self.head_dim).reshape(rows, self.head_dim).contiguous()
            for t in position_embeddings
        )
        slots = [slot for cache in caches for slot in cache.row_slots(self.index)]
        assert self._dense is not None
        chosen = torch.empty(rows, self._top_k, dtype=torch.int32) if self._top_k else None
        native.dense_decode(self._dense, out, cos, sin, slots, chosen)
        if chosen is not None:
            self._routed(chosen)
        return out.view(batch, seq, width)

    def _decode_attention(
        self,
        x: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        caches: list[SessionKV],
    ) -> torch.Tensor:
        """Of normed x [rows, 1, hidden], one decode position each (each cache's step's rows
        in order): the attention output [rows, 1, heads * head_dim], every row's key and
        value written and every row's attention read in one call."""
        heads = self._rotated_heads(x, position_embeddings)
        slots = [slot for cache in caches for slot in cache.row_slots(self.index)]
        return native.decode_attention(heads, slots, self.heads, self.kv_heads, self.scaling)

    def _after_attention(self, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The output projection, the residual and the feed-forward, of attention output attn
        [batch, seq, heads * head_dim]."""
        hidden = hidden + linear(attn, self.o, self.o_bias)
        return hidden + self.mlp(self._norm(hidden, self.post_norm))


def _check_all_used(index: int, weights: dict[str, Source], dense: bool) -> None:
    used = {"input_layernorm.weight", "post_attention_layernorm.weight"}
    used |= {f"self_attn.{p}_proj.{kind}" for p in "qkvo" for kind in ("weight", "bias")}
    used |= {f"self_attn.{p}_norm.weight" for p in "qk"}
    if dense:
        used |= set(MLP_WEIGHTS)
    left = sorted(set(weights) - used)
    if left:
        raise ModelError(f"layer {index} has parameters the lean block would ignore: {left}")


def _float(weight: Source | None) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor):
        raise ModelError("a layer's norms and biases must be float tensors, not quantized")
    return weight


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    if mask is None:  # a fresh prefill (causal) or one decode position (sees everything)
        return F.scaled_dot_product_attention(
            q, k, v, scale=scaling, is_causal=q.shape[2] > 1, enable_gqa=True
        )
    groups = q.shape[1] // k.shape[1]
    if q.shape[2] == 1 and groups > 1:  # one masked position (past a window): as transformers,
        # each kv head's query heads as the rows of one query, the mask shared by all of them
        batch, heads, _, dim = q.shape
        packed = q.reshape(batch, k.shape[1], groups, dim)
        out = F.scaled_dot_product_attention(packed, k, v, attn_mask=mask, scale=scaling)
        return out.reshape(batch, heads, 1, dim)
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)


def lean_or_hf_block(
    config: Any,
    layer: torch.nn.Module,
    index: int,
    weights: dict[str, Source],
    int8: bool,
) -> Block:
    if supports(config):
        return LlamaBlock(config, index, weights, int8)
    return hf_block(config, layer, index, weights, int8)


# A Llama-3 GGUF carries its rope scaling as per-frequency divisors (llama.cpp's rope_freqs
# tensor) rather than as config values; the converter keeps them in the config under this name.
FREQ_FACTORS = "rope_freq_factors"


def _gguf_config(config: Any, reader: Any) -> None:
    tensor = gguf_tensor(reader, "rope_freqs.weight")
    if tensor is not None:
        setattr(config, FREQ_FACTORS, [float(f) for f in tensor.data.reshape(-1)])
    if gguf_field(reader, "llama.rope.scaling.type") == "linear":
        factor = float(gguf_field(reader, "llama.rope.scaling.factor"))
        config.rope_parameters = {**config.rope_parameters, "rope_type": "linear", "factor": factor}


def _rotary_hook(config: Any, module: torch.nn.Module) -> None:
    factors = getattr(config, FREQ_FACTORS, None)
    if factors is None:
        return
    inv_freq: torch.Tensor = module.inv_freq  # type: ignore[assignment]
    if len(factors) != inv_freq.shape[0]:
        raise UnsupportedModelError(
            f"model type {config.model_type!r}: {len(factors)} rope frequency factors "
            f"for {inv_freq.shape[0]} frequencies"
        )
    scaled = inv_freq / torch.tensor(factors, dtype=inv_freq.dtype, device=inv_freq.device)
    module.inv_freq = scaled
    module.original_inv_freq = scaled.clone()


FAMILY = Family(
    name="llama",
    model_types=("llama",),
    gguf_architectures=("llama",),
    block=lean_or_hf_block,
    rope_types=frozenset({"default", "llama3", "linear"}),
    rotary_hook=_rotary_hook,
    gguf_config=_gguf_config,
    gguf_rope_scalings=frozenset({"linear"}),
)
