"""A Qwen2-7B-shaped GGUF of random weights in one of llama.cpp's K-quant mixes, for memory and
speed at size, on the low-bit files a home lab runs big models from.

28 layers, hidden 3584, GQA 28/4 heads (head_dim 128), ffn 18944, vocabulary 152064, q/k/v
biases, an untied head, float32 norms and biases. The tokenizer is Qwen2's own (its fields are
committed in tests/data), so its 152064 tokens match the embedding's rows.

Each mix gives every matrix the type llama.cpp's quantizer (`llama_tensor_get_type` in its
src/llama-quant.cpp) gives it for this shape: an untied head, 7 query heads per kv head, not
Falcon, not 70B, no experts, no importance matrix, layers counted in order. The head is always
Q6_K; the embedding and attn_q, attn_k, ffn_gate, ffn_up keep the mix's default type.

* Q4_K_M (the default, 4.7 GB): Q4_K by default; attn_v and ffn_down Q6_K in the layers that
  get more bits (the first and last eighth and every third in between), else Q4_K.
* Q3_K_M (3.8 GB): Q3_K by default; attn_v Q5_K in the first two layers, Q4_K after;
  attn_output Q4_K; ffn_down Q5_K in the first sixteenth of the layers (layer 0), Q4_K in all
  the others (its rule's Q3_K arm is reached only for Falcon).
* Q2_K (3.0 GB): Q2_K by default; attn_v Q4_K (Q3_K with fewer than 4 query heads per kv
  head); attn_output and ffn_down Q3_K.

Blocks are written tensor by tensor straight into the file (at most one matrix in memory):
the codes are random bytes (every pattern is valid) and each block's float16 scale fields come
from a few thousand headers packed by `harness.kquants`, tiled, chosen so that every matrix has
a standard deviation near 0.02. Built once per mix (about a minute), then cached:

    python -m bench.fixture_7b [--mix Q4_K_M|Q3_K_M|Q2_K] [--cache DIR]   (prints the path)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from harness.gguf_fixture import (
    WEIGHT_STD,
    add_shape,
    build_once,
    more_bits,
    random_blocks,
    write_tensors,
)
from harness.kquants import QK_K, pack_q2_k, pack_q3_k, pack_q4_k, pack_q5_k, pack_q6_k

REPO = Path(__file__).resolve().parent.parent
# beside the other fixtures by default; SWARM_FIXTURE_CACHE puts the 3-5 GB elsewhere
DEFAULT_CACHE = Path(os.environ.get("SWARM_FIXTURE_CACHE", REPO / ".cache" / "fixtures"))
TOKENIZER_FIELDS = REPO / "tests" / "data" / "qwen2.fields.json.gz"
_HEADERS = 4096  # distinct block headers per matrix, tiled over its blocks
_VERSION = 2  # bumped when the bytes written change, so a stale cached file is not reused

Mix = Literal["Q4_K_M", "Q3_K_M", "Q2_K"]
MIXES: tuple[Mix, ...] = get_args(Mix)
DEFAULT_MIX: Mix = "Q4_K_M"
# general.file_type: llama.cpp's LLAMA_FTYPE_MOSTLY_* number of each mix
FILE_TYPES: dict[Mix, int] = {"Q4_K_M": 15, "Q3_K_M": 12, "Q2_K": 10}
# the bytes of a block that hold its scales; the rest are codes, where every pattern is valid
SCALE_BYTES: dict[str, tuple[slice, ...]] = {
    "Q2_K": (slice(0, 16), slice(80, 84)),  # scales and mins; d, dmin after the codes
    "Q3_K": (slice(96, 110),),  # scales, d
    "Q4_K": (slice(0, 16),),  # d, dmin, scales
    "Q5_K": (slice(0, 16),),  # d, dmin, scales
    "Q6_K": (slice(192, 210),),  # scales, d
}


@dataclass(frozen=True)
class Qwen2Spec:
    layers: int = 28
    hidden: int = 3584
    ffn: int = 18944
    heads: int = 28
    kv_heads: int = 4
    vocab: int = 152064
    seed: int = 0

    @property
    def kv(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)


QWEN2_7B = Qwen2Spec()
# Qwen2.5's dense shapes by name (heads and kv heads as the models ship, an untied head and
# the 7B's vocabulary for all), for the one-process table against llama.cpp (bench.shapes)
QWEN25_SHAPES: dict[str, Qwen2Spec] = {
    "0.5b": Qwen2Spec(layers=24, hidden=896, ffn=4864, heads=14, kv_heads=2),
    "1.5b": Qwen2Spec(layers=28, hidden=1536, ffn=8960, heads=12, kv_heads=2),
    "3b": Qwen2Spec(layers=36, hidden=2048, ffn=11008, heads=16, kv_heads=2),
    "7b": QWEN2_7B,
}
# what llama.cpp's quantizer writes instead of a K-quant for a matrix whose rows are not a
# whole number of 256-weight super-blocks (0.5B's width, 896)
K_QUANT_FALLBACKS = {
    "Q2_K": "IQ4_NL",
    "Q3_K": "IQ4_NL",
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
}


def fixture_path(
    spec: Qwen2Spec = QWEN2_7B, cache_dir: Path = DEFAULT_CACHE, mix: Mix = DEFAULT_MIX
) -> Path:
    """The GGUF file for `spec` in `mix`, built on first use (under a temporary name, then
    renamed)."""
    return build_once(cache_dir / file_name(spec, mix), lambda tmp: _write(spec, tmp, mix))


def file_name(spec: Qwen2Spec = QWEN2_7B, mix: Mix = DEFAULT_MIX) -> str:
    """The cached file's name; the default mix's carries no mix, as before there were others,
    so its file stays valid."""
    tag = "" if mix == DEFAULT_MIX else f"-{mix.lower()}"
    return f"qwen2-random-{spec.layers}l-{spec.hidden}-s{spec.seed}{tag}-v{_VERSION}.gguf"


def tensor_plan(
    spec: Qwen2Spec, mix: Mix = DEFAULT_MIX
) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(GGUF name, [rows, cols] or [n], type) for every tensor, in file order."""
    h, kv = spec.hidden, spec.kv

    def matrix(role: str, layer: int, rows: int, cols: int) -> tuple[str, tuple[int, ...], str]:
        name = f"blk.{layer}.{role}.weight" if layer >= 0 else f"{role}.weight"
        qtype = matrix_type(spec, mix, role, layer)
        if cols % QK_K:
            qtype = K_QUANT_FALLBACKS[qtype]
        return name, (rows, cols), qtype

    yield matrix("token_embd", -1, spec.vocab, h)
    for i in range(spec.layers):
        b = f"blk.{i}"
        yield f"{b}.attn_norm.weight", (h,), "F32"
        yield matrix("attn_q", i, h, h)
        yield f"{b}.attn_q.bias", (h,), "F32"
        yield matrix("attn_k", i, kv, h)
        yield f"{b}.attn_k.bias", (kv,), "F32"
        yield matrix("attn_v", i, kv, h)
        yield f"{b}.attn_v.bias", (kv,), "F32"
        yield matrix("attn_output", i, h, h)
        yield f"{b}.ffn_norm.weight", (h,), "F32"
        yield matrix("ffn_gate", i, spec.ffn, h)
        yield matrix("ffn_up", i, spec.ffn, h)
        yield matrix("ffn_down", i, h, spec.ffn)
    yield "output_norm.weight", (h,), "F32"
    yield matrix("output", -1, spec.vocab, h)


def matrix_type(spec: Qwen2Spec, mix: Mix, role: str, layer: int) -> str:
    """The type llama.cpp's quantizer gives matrix `role` (attn_v, ffn_down, output, ...) of
    `layer` (-1 outside the layers) in `mix`, for a model like `spec` (see the docstring)."""
    if role == "output":
        return "Q6_K"
    if mix == "Q4_K_M":
        bigger = role in ("attn_v", "ffn_down") and more_bits(layer, spec.layers)
        return "Q6_K" if bigger else "Q4_K"
    if mix == "Q3_K_M":
        if role == "attn_v":
            return "Q5_K" if layer < 2 else "Q4_K"
        if role == "ffn_down":
            return "Q5_K" if layer < spec.layers // 16 else "Q4_K"
        return "Q4_K" if role == "attn_output" else "Q3_K"
    if role == "attn_v":
        return "Q4_K" if spec.heads // spec.kv_heads >= 4 else "Q3_K"
    return "Q3_K" if role in ("attn_output", "ffn_down") else "Q2_K"


def random_tensor(rng: np.random.Generator, name: str, shape: tuple[int, ...], qtype: str) -> Any:
    """Float32 [n] (norms: ones; biases: small normal values) or uint8 [rows, row bytes]."""
    if qtype == "F32":
        if name.endswith(".bias"):
            return rng.normal(0, WEIGHT_STD, shape).astype(np.float32)
        return np.ones(shape, dtype=np.float32)
    if qtype not in SCALE_BYTES:  # a fallback type: blocks as `harness.gguf_fixture` writes them
        return random_blocks(rng, shape, qtype)
    rows, cols = shape
    n = rows * cols // QK_K
    headers = _headers(rng, qtype)  # whole blocks, their codes zero
    size = headers.shape[1]
    blocks = np.frombuffer(rng.bytes(n * size), dtype=np.uint8).reshape(n, size).copy()
    for field in SCALE_BYTES[qtype]:
        blocks[:, field] = np.resize(headers[:, field], (n, field.stop - field.start))
    return blocks.reshape(rows, -1)


def _headers(rng: np.random.Generator, qtype: str) -> np.ndarray:
    """`_HEADERS` blocks of zero codes whose scales make uniform random codes weights of std
    ~WEIGHT_STD. Q4_K and Q6_K's are picked as `harness.gguf_fixture` picks them. Where a type
    has mins, min = scale and dmin = d x the codes' mean centre the weights; the divisors are
    the codes' standard deviation and the scales' root mean square."""
    zeros = np.zeros((_HEADERS, QK_K), dtype=np.uint8)
    if qtype == "Q2_K":  # w = d * sc * (q - 1.5)
        sc = rng.integers(8, 16, (_HEADERS, 16))
        d = np.full(_HEADERS, WEIGHT_STD / 1.118 / 11.73, dtype=np.float32)
        return pack_q2_k(d, 1.5 * d, sc, sc, zeros)
    if qtype == "Q3_K":  # w = d * sc * (q - 4): no min, so signs at random keep the mean at 0
        signs = 1 - 2 * rng.integers(0, 2, (_HEADERS, 16))
        sc = rng.integers(12, 20, (_HEADERS, 16)) * signs
        d = np.full(_HEADERS, WEIGHT_STD / 2.345 / 15.67, dtype=np.float32)
        return pack_q3_k(d, sc, zeros)
    if qtype == "Q4_K":  # w = step * (q - 7.5): sc = mn, dmin = 7.5 d
        sc = rng.integers(24, 40, (_HEADERS, 8))
        d = np.full(_HEADERS, WEIGHT_STD / 4.6 / 32, dtype=np.float32)
        return pack_q4_k(d, 7.5 * d, sc, sc, zeros)
    if qtype == "Q5_K":  # w = d * sc * (q - 15.5)
        sc = rng.integers(24, 40, (_HEADERS, 8))
        d = np.full(_HEADERS, WEIGHT_STD / 9.233 / 31.84, dtype=np.float32)
        return pack_q5_k(d, 15.5 * d, sc, sc, zeros)
    sc = rng.integers(12, 20, (_HEADERS, 16))  # Q6_K: w = d * sc * (q - 32)
    d = np.full(_HEADERS, WEIGHT_STD / 18.5 / 16, dtype=np.float32)
    return pack_q6_k(d, sc, zeros)


def _write(spec: Qwen2Spec, path: Path, mix: Mix) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    _add_metadata(writer, spec, mix)
    write_tensors(writer, list(tensor_plan(spec, mix)), spec.seed, random_tensor)


def _add_metadata(writer: Any, spec: Qwen2Spec, mix: Mix) -> None:
    name = f"random-qwen2-{spec.layers}l-seed{spec.seed}"
    add_shape(writer, name, spec, 32768, 1e6, 1e-6, FILE_TYPES[mix])
    fields = json.loads(
        gzip.decompress(TOKENIZER_FIELDS.read_bytes()).decode("utf-8", errors="surrogatepass")
    )
    if len(fields["tokenizer.ggml.tokens"]) != spec.vocab:
        raise ValueError(f"the committed Qwen2 vocabulary does not have {spec.vocab} tokens")
    writer.add_tokenizer_model(fields["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(fields["tokenizer.ggml.pre"])
    writer.add_token_list(fields["tokenizer.ggml.tokens"])
    writer.add_token_types(fields["tokenizer.ggml.token_type"])
    writer.add_token_merges(fields["tokenizer.ggml.merges"])
    writer.add_bos_token_id(fields["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(fields["tokenizer.ggml.eos_token_id"])
    writer.add_pad_token_id(fields["tokenizer.ggml.padding_token_id"])
    writer.add_add_bos_token(fields["tokenizer.ggml.add_bos_token"])
    writer.add_chat_template(fields["tokenizer.chat_template"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mix", choices=MIXES, default=DEFAULT_MIX)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--shape", choices=tuple(QWEN25_SHAPES), default="7b")
    args = parser.parse_args()
    print(fixture_path(QWEN25_SHAPES[args.shape], args.cache, args.mix))


if __name__ == "__main__":
    main()
