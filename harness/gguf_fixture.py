"""Seeded random Llama models written as GGUF files in a Q4_K_M-like mix, for tests and benches.

Like llama.cpp's Q4_K_M: Q4_K for most matrices and the embedding, Q6_K for attn_v and
ffn_down in the layers llama.cpp gives more bits (the first and last eighth, every third in
between), and a Q6_K head. Weights are random codes with scales chosen so that every matrix has
a standard deviation near 0.02 (a real model's scale, so activations stay finite). The
tokenizer (and its chat template) is the embedded model's, copied from its GGUF file.

Files are built once per spec and cached (written under a temporary name, then renamed)."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness import block_bytes
from harness.kquants import QK_K, pack_q4_k, pack_q6_k
from swarm.runtime.weights import ggml

WEIGHT_STD = 0.02


@dataclass(frozen=True)
class FixtureSpec:
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    seed: int = 0
    vocab: int = 49152  # the embedded model's tokenizer
    types: tuple[tuple[str, str], ...] = ()  # (GGUF tensor name, type) overriding the mix

    def parameters(self) -> int:
        head_dim = self.hidden // self.heads
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * head_dim
        return self.layers * (attn + 3 * self.hidden * self.ffn) + 2 * self.vocab * self.hidden


# ~1.2B parameters: TinyLlama's shape (22 layers, hidden 2048, GQA 32/4) with a 49k vocabulary
LLAMA_1B = FixtureSpec(layers=22, hidden=2048, ffn=5632, heads=32, kv_heads=4)
# a few layers of the same kinds, for unit tests
LLAMA_TINY = FixtureSpec(layers=3, hidden=256, ffn=512, heads=4, kv_heads=2)


def fixture_path(spec: FixtureSpec, cache_dir: Path) -> Path:
    """The GGUF file for `spec`, built on first use."""
    key = hashlib.sha256(repr(sorted(asdict(spec).items())).encode()).hexdigest()[:12]
    path = cache_dir / f"llama-random-{spec.layers}l-{spec.hidden}-{key}.gguf"
    return build_once(path, lambda tmp: _write(spec, tmp))


def build_once(path: Path, write: Callable[[Path], None]) -> Path:
    """`path`, written by `write` (to a temporary name, then renamed) unless it exists."""
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            write(tmp)
            tmp.rename(path)
        finally:
            tmp.unlink(missing_ok=True)
    return path


def more_bits(layer: int, layers: int) -> bool:
    """Layers whose attn_v and ffn_down llama.cpp's Q4_K_M stores as Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_plan(spec: FixtureSpec) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(GGUF name, [rows, cols] or [n], type) for every tensor, in file order."""
    types = dict(spec.types)
    for name, shape, qtype in _q4_k_m_plan(spec):
        yield name, shape, types.get(name, qtype)


def _q4_k_m_plan(spec: FixtureSpec) -> Iterator[tuple[str, tuple[int, ...], str]]:
    kv = spec.kv_heads * (spec.hidden // spec.heads)
    yield "token_embd.weight", (spec.vocab, spec.hidden), "Q4_K"
    for i in range(spec.layers):
        big = "Q6_K" if more_bits(i, spec.layers) else "Q4_K"
        b = f"blk.{i}"
        yield f"{b}.attn_norm.weight", (spec.hidden,), "F32"
        yield f"{b}.attn_q.weight", (spec.hidden, spec.hidden), "Q4_K"
        yield f"{b}.attn_k.weight", (kv, spec.hidden), "Q4_K"
        yield f"{b}.attn_v.weight", (kv, spec.hidden), big
        yield f"{b}.attn_output.weight", (spec.hidden, spec.hidden), "Q4_K"
        yield f"{b}.ffn_norm.weight", (spec.hidden,), "F32"
        yield f"{b}.ffn_gate.weight", (spec.ffn, spec.hidden), "Q4_K"
        yield f"{b}.ffn_up.weight", (spec.ffn, spec.hidden), "Q4_K"
        yield f"{b}.ffn_down.weight", (spec.hidden, spec.ffn), big
    yield "output_norm.weight", (spec.hidden,), "F32"
    yield "output.weight", (spec.vocab, spec.hidden), "Q6_K"


def random_blocks(rng: np.random.Generator, shape: tuple[int, ...], qtype: str) -> np.ndarray:
    """Random weights of std ~WEIGHT_STD as blocks: uint8 [rows, row_bytes] (or float32 ones)."""
    if qtype == "F32":
        return np.ones(shape, dtype=np.float32)
    rows, cols = shape
    n = rows * cols // QK_K
    if qtype not in ggml.BLOCKS and qtype not in _GGUF_QUANTIZES:  # a type swarm refuses
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        elements, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
        return rng.integers(0, 256, (rows, cols // elements * nbytes), dtype=np.uint8)
    if qtype not in _GGUF_QUANTIZES and qtype not in ("Q4_K", "Q6_K"):
        return _scaled_random_blocks(rng, rows, cols, qtype)
    if qtype not in ("Q4_K", "Q6_K"):  # types the gguf package quantizes itself
        from gguf import GGMLQuantizationType, quantize

        weights = rng.normal(0, WEIGHT_STD, shape).astype(np.float32)
        return quantize(weights, GGMLQuantizationType[qtype])
    if qtype == "Q4_K":  # w = step * (q - 7.5): sc = mn, dmin = 7.5 d
        sc = rng.integers(24, 40, (n, 8))
        d = np.full(n, WEIGHT_STD / 4.6 / 32, dtype=np.float32)
        q = rng.integers(0, 16, (n, QK_K), dtype=np.uint8)
        blocks = pack_q4_k(d, 7.5 * d, sc, sc, q)
    else:  # Q6_K: w = d * sc * (q - 32)
        sc = rng.integers(12, 20, (n, 16))
        d = np.full(n, WEIGHT_STD / 18.5 / 16, dtype=np.float32)
        blocks = pack_q6_k(d, sc, rng.integers(0, 64, (n, QK_K), dtype=np.uint8))
    return blocks.reshape(rows, -1)


_GGUF_QUANTIZES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4")


def _scaled_random_blocks(rng: np.random.Generator, rows: int, cols: int, qtype: str) -> np.ndarray:
    """Random codes of any other type, its scales chosen so that the weights' standard
    deviation is near WEIGHT_STD (weights scale with the float16 scales)."""
    from gguf import GGMLQuantizationType, dequantize

    elements = ggml.BLOCKS[qtype].elements
    probe = block_bytes.random_blocks(np.random.default_rng(0), 64, qtype, (1e-3, 1e-3))
    std = float(dequantize(probe, GGMLQuantizationType[qtype]).std())
    base = 1e-3 * WEIGHT_STD / std
    blocks = block_bytes.random_blocks(rng, rows * cols // elements, qtype, (base, 1.2 * base))
    return blocks.reshape(rows, -1)


Plan = list[tuple[str, tuple[int, ...], str]]  # (GGUF name, shape rows first, type)
MakeTensor = Callable[[np.random.Generator, str, tuple[int, ...], str], np.ndarray]


def _write(spec: FixtureSpec, path: Path) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    _add_metadata(writer, spec)
    write_tensors(
        writer, list(tensor_plan(spec)), spec.seed, lambda r, _, s, q: random_blocks(r, s, q)
    )


def write_tensors(writer: Any, plan: Plan, seed: int, make: MakeTensor) -> None:
    """The table, then each tensor's data as `make` returns it, one at a time (never the whole
    file in memory); the metadata is already on `writer`. Tensor i's numbers come from the
    generator seeded [seed, i]."""
    import gguf

    for name, shape, qtype in plan:
        if qtype == "F32":
            elements = int(np.prod(shape))
            writer.add_tensor_info(name, shape, np.dtype(np.float32), 4 * elements)
            continue
        kind = gguf.GGMLQuantizationType[qtype]
        block, size = gguf.GGML_QUANT_SIZES[kind]
        byte_shape = (*shape[:-1], shape[-1] // block * size)  # the writer takes row bytes
        nbytes = int(np.prod(byte_shape))
        writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for i, (name, shape, qtype) in enumerate(plan):
        writer.write_tensor_data(make(np.random.default_rng([seed, i]), name, shape, qtype))
    writer.close()


def add_shape(
    writer: Any,
    name: str,
    spec: Any,
    context: int,
    rope_base: float,
    eps: float,
    file_type: int = 15,  # MOSTLY_Q4_K_M
) -> None:
    """The model's name and shape keys (`spec` has layers, hidden, ffn, heads, kv_heads,
    vocab)."""
    writer.add_name(name)
    writer.add_context_length(context)
    writer.add_embedding_length(spec.hidden)
    writer.add_block_count(spec.layers)
    writer.add_feed_forward_length(spec.ffn)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_rope_dimension_count(spec.hidden // spec.heads)
    writer.add_rope_freq_base(rope_base)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_vocab_size(spec.vocab)
    writer.add_file_type(file_type)


def _add_metadata(writer: Any, spec: FixtureSpec) -> None:
    add_shape(writer, f"random-llama-{spec.layers}l-seed{spec.seed}", spec, 2048, 10000.0, 1e-5)
    for key, value, vtype, sub in _tokenizer_fields():
        writer.add_key_value(key, value, vtype, sub)


def _tokenizer_fields() -> Iterator[tuple[str, Any, Any, Any]]:
    from gguf import GGUFReader, GGUFValueType

    from swarm.runtime.checkpoint.source import resolve_model

    reader = GGUFReader(str(resolve_model("smollm2-135m-instruct").path))
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            sub = field.types[1] if vtype is GGUFValueType.ARRAY else None
            yield key, field.contents(), vtype, sub
