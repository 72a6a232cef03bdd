"""A seeded random Qwen3-MoE written as a GGUF file in a Q4_K_M-like mix, big enough that one
node of a small machine cannot hold it: benches and the opt-in slow test split it over nodes.

The mix follows llama.cpp's Q4_K_M for qwen3moe: experts in Q4_K with ffn_down_exps in Q6_K
in the layers `gguf_fixture.more_bits` gives more bits, attention Q4_K with attn_v likewise
Q6_K there, a Q4_K embedding and a Q6_K head; norms and the router (ffn_gate_inp) in F32. Block
weights come from `gguf_fixture.random_blocks` (std ~0.02). The router's rows are normal with
std 1/sqrt(hidden), so on the normed hidden state (RMS 1) the logits have a standard
deviation near 1: each token's top k is spread over the experts, not the same few for all.
The tokenizer is the embedded SmolLM2's, so prompts tokenize.

The file is written tensor by tensor (the largest, one layer's ffn_*_exps, is ~30 MB of
blocks) and cached by its spec, written under a temporary name and then renamed."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.gguf_fixture import (
    _tokenizer_fields,
    build_once,
    more_bits,
    random_blocks,
    write_tensors,
)

ARCH = "qwen3moe"


@dataclass(frozen=True)
class MoeSpec:
    layers: int
    hidden: int
    experts: int
    top_k: int
    expert_ffn: int  # each expert's intermediate size (a multiple of 256)
    heads: int
    kv_heads: int
    head_dim: int
    seed: int = 0
    vocab: int = 49152  # the embedded model's tokenizer

    def parameters(self) -> int:
        attn = 2 * self.hidden * self.head_dim * (self.heads + self.kv_heads)
        experts = 3 * self.experts * self.hidden * self.expert_ffn
        return self.layers * (attn + experts) + 2 * self.vocab * self.hidden

    def active_parameters(self) -> int:
        """Per decode token: attention and the top k experts of every layer, and the head."""
        attn = 2 * self.hidden * self.head_dim * (self.heads + self.kv_heads)
        experts = 3 * self.top_k * self.hidden * self.expert_ffn
        return self.layers * (attn + experts) + self.vocab * self.hidden


# ~5.2B parameters (~0.9B active per token), 3.15 GB: 48 layers of 64 experts of 512, 8
# routed, GQA 16/4 of head_dim 128
QWEN3_MOE_3GB = MoeSpec(
    layers=48, hidden=1024, experts=64, top_k=8, expert_ffn=512, heads=16, kv_heads=4, head_dim=128
)
# the same kinds and routing (64 experts, 8 routed) at a size a unit test writes in seconds
QWEN3_MOE_TINY = MoeSpec(
    layers=2, hidden=256, experts=64, top_k=8, expert_ffn=256, heads=4, kv_heads=2, head_dim=64
)


def moe_fixture_path(spec: MoeSpec, cache_dir: Path) -> Path:
    """The GGUF file for `spec`, built on first use."""
    key = hashlib.sha256(repr(sorted(asdict(spec).items())).encode()).hexdigest()[:12]
    path = cache_dir / f"qwen3moe-random-{spec.layers}l-{spec.experts}x{spec.expert_ffn}-{key}.gguf"
    return build_once(path, lambda tmp: _write(spec, tmp))


def tensor_plan(spec: MoeSpec) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(GGUF name, shape in rows first ([experts, rows, cols], [rows, cols] or [n]), type)."""
    q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    e, h, f = spec.experts, spec.hidden, spec.expert_ffn
    yield "token_embd.weight", (spec.vocab, h), "Q4_K"
    for i in range(spec.layers):
        big = "Q6_K" if more_bits(i, spec.layers) else "Q4_K"
        b = f"blk.{i}"
        yield f"{b}.attn_norm.weight", (h,), "F32"
        yield f"{b}.attn_q.weight", (q, h), "Q4_K"
        yield f"{b}.attn_k.weight", (kv, h), "Q4_K"
        yield f"{b}.attn_v.weight", (kv, h), big
        yield f"{b}.attn_output.weight", (h, q), "Q4_K"
        yield f"{b}.attn_q_norm.weight", (spec.head_dim,), "F32"
        yield f"{b}.attn_k_norm.weight", (spec.head_dim,), "F32"
        yield f"{b}.ffn_norm.weight", (h,), "F32"
        yield f"{b}.ffn_gate_inp.weight", (e, h), "F32"
        yield f"{b}.ffn_gate_exps.weight", (e, f, h), "Q4_K"
        yield f"{b}.ffn_up_exps.weight", (e, f, h), "Q4_K"
        yield f"{b}.ffn_down_exps.weight", (e, h, f), big
    yield "output_norm.weight", (h,), "F32"
    yield "output.weight", (spec.vocab, h), "Q6_K"


def file_bytes(spec: MoeSpec) -> int:
    """The tensors' bytes (the file is this plus its header and the tokenizer, ~2 MB)."""
    import gguf

    total = 0
    for _, shape, qtype in tensor_plan(spec):
        elements = int(np.prod(shape))
        if qtype == "F32":
            total += 4 * elements
        else:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
            total += elements // block * size
    return total


def _tensor(rng: np.random.Generator, name: str, shape: tuple[int, ...], qtype: str) -> np.ndarray:
    if name.endswith("ffn_gate_inp.weight"):  # logits of std ~1 on a normed hidden state
        return rng.normal(0, shape[1] ** -0.5, shape).astype(np.float32)
    if qtype == "F32":
        return random_blocks(rng, shape, qtype)
    rows = int(np.prod(shape[:-1]))
    blocks = random_blocks(rng, (rows, shape[-1]), qtype)
    return blocks.reshape(*shape[:-1], -1)


def _write(spec: MoeSpec, path: Path) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), ARCH)
    _add_metadata(writer, spec)
    write_tensors(writer, list(tensor_plan(spec)), spec.seed, _tensor)


def _add_metadata(writer: Any, spec: MoeSpec) -> None:
    writer.add_name(f"random-qwen3moe-{spec.layers}l-seed{spec.seed}")
    writer.add_context_length(4096)
    writer.add_embedding_length(spec.hidden)
    writer.add_block_count(spec.layers)
    writer.add_feed_forward_length(spec.expert_ffn * spec.top_k)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_expert_count(spec.experts)
    writer.add_expert_used_count(spec.top_k)
    writer.add_expert_feed_forward_length(spec.expert_ffn)
    writer.add_vocab_size(spec.vocab)
    writer.add_file_type(15)  # MOSTLY_Q4_K_M
    for key, value, vtype, sub in _tokenizer_fields():
        writer.add_key_value(key, value, vtype, sub)
