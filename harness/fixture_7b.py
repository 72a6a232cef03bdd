"""A Qwen2-7B-shaped GGUF of random weights in a Q4_K_M-like mix, for memory and speed at size.

28 layers, hidden 3584, GQA 28/4 heads (head_dim 128), ffn 18944, vocabulary 152064, q/k/v
biases, an untied head: 4.7 GB. Like llama.cpp's Q4_K_M (and `tests.gguf_fixture`): Q4_K for
most matrices and the embedding, Q6_K for attn_v and ffn_down on the layers llama.cpp gives
more bits, a Q6_K head, float32 norms and biases. The tokenizer is Qwen2's own (its fields are
committed in tests/data), so its 152064 tokens match the embedding's rows.

Blocks are written tensor by tensor straight into the file (at most one matrix in memory):
the codes are random bytes (every pattern is valid) and each block's float16 scales come from a
few thousand headers packed by `tests.kquants`, tiled, chosen so that every matrix has a
standard deviation near 0.02. Built once (about a minute), then cached:

    python -m bench.fixture_7b [--cache DIR]   (prints the file's path)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.gguf_fixture import WEIGHT_STD, add_shape, build_once, more_bits, write_tensors
from harness.kquants import QK_K, pack_q4_k, pack_q6_k

REPO = Path(__file__).resolve().parent.parent
# beside the other fixtures by default; SWARM_FIXTURE_CACHE puts the 4.7 GB elsewhere
DEFAULT_CACHE = Path(os.environ.get("SWARM_FIXTURE_CACHE", REPO / ".cache" / "fixtures"))
TOKENIZER_FIELDS = REPO / "tests" / "data" / "qwen2.fields.json.gz"
_HEADERS = 4096  # distinct block headers per matrix, tiled over its blocks
_VERSION = 2  # bumped when the bytes written change, so a stale cached file is not reused


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


def fixture_path(spec: Qwen2Spec = QWEN2_7B, cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The GGUF file for `spec`, built on first use (under a temporary name, then renamed)."""
    name = f"qwen2-random-{spec.layers}l-{spec.hidden}-s{spec.seed}-v{_VERSION}.gguf"
    return build_once(cache_dir / name, lambda tmp: _write(spec, tmp))


def tensor_plan(spec: Qwen2Spec) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(GGUF name, [rows, cols] or [n], type) for every tensor, in file order."""
    h, kv = spec.hidden, spec.kv
    yield "token_embd.weight", (spec.vocab, h), "Q4_K"
    for i in range(spec.layers):
        big = "Q6_K" if more_bits(i, spec.layers) else "Q4_K"
        b = f"blk.{i}"
        yield f"{b}.attn_norm.weight", (h,), "F32"
        yield f"{b}.attn_q.weight", (h, h), "Q4_K"
        yield f"{b}.attn_q.bias", (h,), "F32"
        yield f"{b}.attn_k.weight", (kv, h), "Q4_K"
        yield f"{b}.attn_k.bias", (kv,), "F32"
        yield f"{b}.attn_v.weight", (kv, h), big
        yield f"{b}.attn_v.bias", (kv,), "F32"
        yield f"{b}.attn_output.weight", (h, h), "Q4_K"
        yield f"{b}.ffn_norm.weight", (h,), "F32"
        yield f"{b}.ffn_gate.weight", (spec.ffn, h), "Q4_K"
        yield f"{b}.ffn_up.weight", (spec.ffn, h), "Q4_K"
        yield f"{b}.ffn_down.weight", (h, spec.ffn), big
    yield "output_norm.weight", (h,), "F32"
    yield "output.weight", (spec.vocab, h), "Q6_K"


def random_tensor(rng: np.random.Generator, name: str, shape: tuple[int, ...], qtype: str) -> Any:
    """Float32 [n] (norms: ones; biases: small normal values) or uint8 [rows, row bytes]."""
    if qtype == "F32":
        if name.endswith(".bias"):
            return rng.normal(0, WEIGHT_STD, shape).astype(np.float32)
        return np.ones(shape, dtype=np.float32)
    rows, cols = shape
    n = rows * cols // QK_K
    headers = _headers(rng, qtype)
    size = 144 if qtype == "Q4_K" else 210
    blocks = np.frombuffer(rng.bytes(n * size), dtype=np.uint8).reshape(n, size).copy()
    tiled = np.resize(headers, (n, headers.shape[1]))
    if qtype == "Q4_K":  # d, dmin, scales lead the block
        blocks[:, : headers.shape[1]] = tiled
    else:  # Q6_K: scales and d close it
        blocks[:, -headers.shape[1] :] = tiled
    return blocks.reshape(rows, -1)


def _headers(rng: np.random.Generator, qtype: str) -> np.ndarray:
    """Scale fields of `_HEADERS` blocks, as `tests.gguf_fixture` picks them (uniform codes
    then give weights of std ~WEIGHT_STD)."""
    zeros = np.zeros((_HEADERS, QK_K), dtype=np.uint8)
    if qtype == "Q4_K":  # w = step * (q - 7.5): sc = mn, dmin = 7.5 d
        sc = rng.integers(24, 40, (_HEADERS, 8))
        d = np.full(_HEADERS, WEIGHT_STD / 4.6 / 32, dtype=np.float32)
        return pack_q4_k(d, 7.5 * d, sc, sc, zeros)[:, :16]
    sc = rng.integers(12, 20, (_HEADERS, 16))  # Q6_K: w = d * sc * (q - 32)
    d = np.full(_HEADERS, WEIGHT_STD / 18.5 / 16, dtype=np.float32)
    return pack_q6_k(d, sc, zeros)[:, -18:]


def _write(spec: Qwen2Spec, path: Path) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    _add_metadata(writer, spec)
    write_tensors(writer, list(tensor_plan(spec)), spec.seed, random_tensor)


def _add_metadata(writer: Any, spec: Qwen2Spec) -> None:
    add_shape(writer, f"random-qwen2-{spec.layers}l-seed{spec.seed}", spec, 32768, 1e6, 1e-6)
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
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args()
    print(fixture_path(QWEN2_7B, args.cache))


if __name__ == "__main__":
    main()
