"""The embedded model made deeper: a bigger target of the same vocabulary whose next token the
embedded model predicts most, not all, of the time, for measuring what a draft model buys.

Every one of SmolLM2-135M's layers is followed by `copies` copies of itself whose attention
output and FFN down projections are scaled by `scale` (their Q4_1 blocks' scale and minimum
both multiplied, so only float16 rounding changes): each copy adds a small change to the
residual stream. A token of the deepened model costs (copies + 1) times the embedded model's
layer work, and its argmax agrees with the embedded model's where those changes do not tip
it; bench.speculative measures how often. No model hub is reachable here, so this is the
stand-in for a bigger sibling sharing the small model's vocabulary.

    python -m harness.deepened_model [--copies 3] [--scale 0.05]   (prints the file's path)"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from harness.gguf_fixture import (
    FixtureSpec,
    Plan,
    _tokenizer_fields,
    add_shape,
    build_once,
    write_tensors,
)
from harness.paths import FIXTURES

_SCALED = ("attn_output.weight", "ffn_down.weight")  # what a layer adds to the residual stream
_Q4_1_BLOCK = 20  # bytes: float16 scale, float16 minimum, 16 bytes of 4-bit codes


def deepened_path(copies: int = 3, scale: float = 0.05, cache_dir: Path = FIXTURES) -> Path:
    path = cache_dir / f"smollm2-deepened-x{copies + 1}-s{scale:g}.gguf"
    return build_once(path, lambda tmp: _write(copies, scale, tmp))


def scaled_q4_1(blocks: np.ndarray, scale: float) -> np.ndarray:
    """Q4_1 rows (uint8 [rows, row bytes]) whose every weight is `scale` times the original's."""
    out = blocks.copy()
    halves = out.reshape(-1, _Q4_1_BLOCK)[:, :4].view(np.float16)  # d and m of each block
    halves *= np.float16(scale)
    return out


def _write(copies: int, scale: float, path: Path) -> None:
    import gguf

    from swarm.runtime.checkpoint.source import resolve_model

    reader = gguf.GGUFReader(str(resolve_model("smollm2-135m-instruct").path))
    tensors = {t.name: t for t in reader.tensors}
    layers = 1 + max(int(n.split(".")[1]) for n in tensors if n.startswith("blk."))
    plan: Plan = []
    sources: dict[str, tuple[str, float]] = {}  # planned tensor -> the original, its scale

    def add(name: str, original: str, factor: float = 1.0) -> None:
        plan.append(_entry(name, tensors[original]))
        sources[name] = (original, factor)

    add("token_embd.weight", "token_embd.weight")
    layer_names = sorted({n.split(".", 2)[2] for n in tensors if n.startswith("blk.0.")})
    new = 0
    for i in range(layers):
        for copy in range(copies + 1):
            for part in layer_names:
                factor = scale if copy and part in _SCALED else 1.0
                add(f"blk.{new}.{part}", f"blk.{i}.{part}", factor)
            new += 1
    for name in ("output_norm.weight", "output.weight"):
        if name in tensors:
            add(name, name)
    writer = gguf.GGUFWriter(str(path), "llama")
    shape = FixtureSpec(
        layers=new,
        hidden=int(_field(reader, "llama.embedding_length")),
        ffn=int(_field(reader, "llama.feed_forward_length")),
        heads=int(_field(reader, "llama.attention.head_count")),
        kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        vocab=int(tensors["token_embd.weight"].shape[1]),
    )
    add_shape(
        writer,
        f"smollm2-135m-deepened-x{copies + 1}",
        shape,
        int(_field(reader, "llama.context_length")),
        float(_field(reader, "llama.rope.freq_base")),
        float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        int(_field(reader, "general.file_type")),
    )
    for key, value, vtype, sub in _tokenizer_fields():
        writer.add_key_value(key, value, vtype, sub)

    def make(_rng: Any, name: str, _shape: Any, qtype: str) -> np.ndarray:
        original, factor = sources[name]
        data = np.asarray(tensors[original].data)
        if factor == 1.0:
            return data
        if qtype != "Q4_1":
            raise ValueError(f"{original} is {qtype}; only Q4_1 rows are scaled here")
        return scaled_q4_1(data, factor)

    write_tensors(writer, plan, 0, make)


def _entry(name: str, tensor: Any) -> tuple[str, tuple[int, ...], str]:
    return name, tuple(int(x) for x in reversed(tensor.shape)), tensor.tensor_type.name


def _field(reader: Any, key: str) -> Any:
    return reader.fields[key].contents()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--scale", type=float, default=0.05)
    args = parser.parse_args()
    print(deepened_path(args.copies, args.scale))


if __name__ == "__main__":
    main()
