"""Which CPU kernel runs packed GGUF matrices: one product per candidate, on the 1B fixture's
matrix shapes, with one token (decode) and 32 (prefill), on torch's threads.

* float32: F.linear on the dequantized matrix (what `--dtype float32` holds: 4 bytes/weight)
* int4 bf16 / int4 fp32: `_weight_int4pack_mm_for_cpu`, groups of 32, activations in bfloat16
  or float32 (Q4_0, Q4_1 and Q4_K map onto it)
* int8 bf16: `_weight_int8pack_mm`, one scale per row (what Q5_K, Q6_K, Q8_0 become)
* swarm q4 / swarm i8: swarm's own AVX2 kernels (`swarm.runtime.weights.native`) on the same 4-bit
  groups and per-row int8 values, activations rounded to int16 per group of 32 (where built)
* dequant: decode the blocks and F.linear on every product (the CUDA path, here on CPU)

Also the error of each against the float32 product of the same blocks (max |diff| / max |out|).

Where the CPU has AVX-512 VNNI, a second table times swarm's kernels on their AVX2 rows and on
their AVX-512 rows (the same bits), alternating call by call so that both see the same machine,
and prints the ratio of the medians.

    python -m bench.kernels [--threads 0] [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from harness.gguf_fixture import LLAMA_1B, random_blocks
from swarm.runtime.weights import native
from swarm.runtime.weights.packed import (
    DequantMatrix,
    Int4Matrix,
    NativeQ4Matrix,
    PackedTensor,
    int8_from_packed,
)
from swarm.runtime.weights.quant import KERNEL_DTYPE

SHAPES = {  # name: (rows, cols, type) of the 1B fixture's matrices
    "qkv": (LLAMA_1B.hidden + 2 * 256, LLAMA_1B.hidden, "Q4_K"),
    "gate_up": (2 * LLAMA_1B.ffn, LLAMA_1B.hidden, "Q4_K"),
    "down Q4_K": (LLAMA_1B.hidden, LLAMA_1B.ffn, "Q4_K"),
    "down Q6_K": (LLAMA_1B.hidden, LLAMA_1B.ffn, "Q6_K"),
}


def timed(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1000


def alternated(run: Callable[[], torch.Tensor], repeats: int) -> tuple[float, float]:
    """Median ms per call of `run` on the AVX2 rows and on the AVX-512 rows, call by call."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for wide in (False, True):
            native.use_wide(wide)
            start = time.perf_counter()
            run()
            times[wide].append((time.perf_counter() - start) * 1000)
    native.use_wide(True)
    return statistics.median(times[False]), statistics.median(times[True])


def int4_fp32(m: Int4Matrix, x: torch.Tensor) -> torch.Tensor:
    return torch._weight_int4pack_mm_for_cpu(x, m.weight, 32, m.scales_and_zeros.to(torch.float32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--tokens", default="1,8,32", help="rows per product, comma-separated (8: a decode batch)"
    )
    args = parser.parse_args()
    token_counts = [int(t) for t in args.tokens.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}; ms per product (error vs float32)")
    print(f"swarm's kernels: {'built' if native.available() else 'not available here'}")
    print(f"{'matrix':12}{'tokens':>7}" + "".join(f"{k:>22}" for k in CANDIDATES))
    rng = np.random.default_rng(0)
    wide_rows: list[str] = []
    for name, (rows, cols, qtype) in SHAPES.items():
        packed = PackedTensor(
            qtype, torch.from_numpy(random_blocks(rng, (rows, cols), qtype)), cols
        )
        dense = packed.dequantize()
        forms = {
            "float32": dense,
            "dequant": DequantMatrix(packed),
            "int8 bf16": int8_from_packed(packed),
        }
        if native.available():
            forms["swarm i8"] = forms["int8 bf16"]
        if qtype == "Q4_K":
            forms["int4 bf16"] = forms["int4 fp32"] = Int4Matrix(packed)
            if native.available():
                forms["swarm q4"] = NativeQ4Matrix(packed)
        for tokens in token_counts:
            x = torch.randn(tokens, cols)
            want = F.linear(x, dense)
            cells = []
            for kind in CANDIDATES:
                if kind not in forms:
                    cells.append(f"{'-':>22}")
                    continue
                run = CANDIDATES[kind](forms[kind], x)
                err = (run().float() - want).abs().max() / want.abs().max()
                cells.append(f"{timed(run, args.repeats):13.2f} ({err:.0e})")
            print(f"{name:12}{tokens:7}" + "".join(cells))
            kind = "swarm q4" if "swarm q4" in forms else "swarm i8"
            if kind in forms and native.use_wide(True):
                narrow, wide = alternated(CANDIDATES[kind](forms[kind], x), 2 * args.repeats)
                wide_rows.append(
                    f"{name:12}{tokens:7}{kind:>10}{narrow:10.3f}{wide:10.3f}{narrow / wide:9.2f}x"
                )
    if wide_rows:
        print("\nswarm's kernels on their AVX2 and AVX-512 VNNI rows, alternating (median ms)")
        print(
            f"{'matrix':12}{'tokens':>7}{'kernel':>10}{'AVX2':>10}{'AVX-512':>10}{'speed-up':>10}"
        )
        print("\n".join(wide_rows))


CANDIDATES: dict[str, Callable[[object, torch.Tensor], Callable[[], torch.Tensor]]] = {
    "float32": lambda w, x: lambda: F.linear(x, w),  # type: ignore[arg-type]
    "int4 bf16": lambda w, x: lambda: w.matmul(x),  # type: ignore[attr-defined]
    "int4 fp32": lambda w, x: lambda: int4_fp32(w, x),  # type: ignore[arg-type]
    "int8 bf16": lambda w, x: (
        lambda: torch._weight_int8pack_mm(
            x.to(KERNEL_DTYPE),
            w.values,  # type: ignore[attr-defined]
            w.scales,  # type: ignore[attr-defined]
        )
    ),
    "swarm q4": lambda w, x: lambda: w.matmul(x),  # type: ignore[attr-defined]
    "swarm i8": lambda w, x: lambda: w.matmul(x),  # type: ignore[attr-defined]
    "dequant": lambda w, x: lambda: w.matmul(x),  # type: ignore[attr-defined]
}


if __name__ == "__main__":
    main()
