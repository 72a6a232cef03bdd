"""Every GGUF block type on one matrix shape: what a packed node holds for it, how close its
products are to float32 of the same dequantized weights, and how fast they run, beside the
path it replaced and float32 itself, all in one run.

For each type, random valid blocks of a [rows, cols] matrix (4096 x 4096 by default) and:

* kernel: what `Matrices` builds on this node (swarm's 4-bit groups for Q4_1, the block
  kernels for the rest, where built)
* memory / file: that matrix's bytes over the blocks' bytes
* max err: max |kernel - float32| / max |float32| over random activations, float32 being
  F.linear on the exact dequantization; top-1: the share of activation rows whose largest
  output is float32's
* ms at 1 and 8 activation rows for the kernel, for the path before it (per-row int8
  requantized from the blocks, the block kernel beside Q4_1's 4-bit groups, the 4-bit groups
  Q4_0 ran on at 1.11x its bytes) and for float32,
  the three taking turns call by call so that all see the same machine (median of --repeats)

    python -m bench.quant_types [--threads 1] [--repeats 9] [--rows 4096] [--cols 4096]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from harness.block_bytes import random_blocks
from swarm.runtime.weights import ggml, native
from swarm.runtime.weights.blocks import NativeBlockMatrix
from swarm.runtime.weights.packed import Matrices, NativeQ4Matrix, PackedTensor, int8_from_packed
from swarm.runtime.weights.quant import Matrix

TOKENS = (1, 8)


def alternated(runs: list[Callable[[], torch.Tensor]], repeats: int) -> list[float]:
    """Median ms per call of each run, the runs taking turns call by call."""
    times: list[list[float]] = [[] for _ in runs]
    for run in runs:
        run()  # warm-up
    for _ in range(repeats):
        for i, run in enumerate(runs):
            start = time.perf_counter()
            run()
            times[i].append((time.perf_counter() - start) * 1000)
    return [statistics.median(t) for t in times]


def before(packed: PackedTensor, kernel: Matrix) -> tuple[str, Matrix]:
    """The path this type took before the block kernels (or beside them, for 4-bit types)."""
    if isinstance(kernel, NativeQ4Matrix):
        return "blocks", NativeBlockMatrix(packed.qtype, packed.data, packed.cols)
    if packed.qtype == "Q4_0" and isinstance(kernel, NativeBlockMatrix):
        return "4-bit groups", NativeQ4Matrix(packed)
    return "int8 rows", int8_from_packed(packed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--types", default=",".join(ggml.BLOCKS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"{args.rows}x{args.cols}, torch threads {torch.get_num_threads()}, "
        f"kernels: {native.kernel_name()}; ms are medians of {args.repeats} alternated calls"
    )
    head = "| type | kernel | memory / file | max err | top-1 |"
    head += "".join(f" ms {t} row{'s' * (t > 1)} |" for t in TOKENS)
    print(head + " before | before ms (1, 8) | float32 ms (1, 8) |")
    rng = np.random.default_rng(0)
    for qtype in args.types.split(","):
        print("| " + " | ".join(row(qtype, args.rows, args.cols, args.repeats, rng)) + " |")


def row(qtype: str, rows: int, cols: int, repeats: int, rng: np.random.Generator) -> list[str]:
    kind = ggml.BLOCKS[qtype]
    raw = random_blocks(rng, rows * cols // kind.elements, qtype)
    packed = PackedTensor(qtype, torch.from_numpy(raw.reshape(rows, -1)), cols)
    dense = packed.dequantize()
    kernel = Matrices(torch.device("cpu")).fused([packed])
    name, old = before(packed, kernel)
    x = torch.randn(64, cols)
    want = F.linear(x, dense)
    got = kernel.matmul(x)
    err = float((got - want).abs().max() / want.abs().max())
    top1 = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    old_err = float((old.matmul(x) - want).abs().max() / want.abs().max())
    ms = [timings(kernel, old, dense, x[:tokens].contiguous(), repeats) for tokens in TOKENS]
    return [
        qtype,
        type(kernel).__name__,
        f"{kernel.nbytes / packed.nbytes:.2f}",
        f"{err:.1e}",
        f"{top1:.2f}",
        *(f"{m[0]:.2f}" for m in ms),
        f"{name} ({old.nbytes / packed.nbytes:.2f}x, err {old_err:.1e})",
        ", ".join(f"{m[1]:.2f}" for m in ms),
        ", ".join(f"{m[2]:.2f}" for m in ms),
    ]


def timings(
    kernel: Matrix, old: Matrix, dense: torch.Tensor, x: torch.Tensor, repeats: int
) -> list[float]:
    """ms of the kernel, the path before it and float32, alternated."""
    return alternated(
        [lambda: kernel.matmul(x), lambda: old.matmul(x), lambda: F.linear(x, dense)], repeats
    )


if __name__ == "__main__":
    main()
