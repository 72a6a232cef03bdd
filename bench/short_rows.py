"""Products of the shapes a small model's decode step and verify step run: rows of a few
hundred columns, where what a row costs after its multiply-adds (its last groups, its sums,
its offsets, its store) weighs as much as the multiply-adds. The embedded model's matrices
(hidden 576, ffn 1536, a 49152-row head) by default, random valid blocks of each type, one
thread, microseconds a product (the best of --repeats runs of many calls) and what that is
in multiply-adds a second, at 1 and 8 activation rows, beside one 4096 x 4096 matrix whose
rows are long.

    python -m bench.short_rows [--types Q4_1,Q8_0] [--repeats 5]

To compare two builds, run it in each in the same minutes: the figures move by 10-20%
between minutes on a shared machine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from harness.block_bytes import random_blocks
from swarm.runtime.weights import ggml
from swarm.runtime.weights.packed import Matrices, PackedTensor
from swarm.runtime.weights.quant import Matrix

# (rows, cols, what it is in the embedded model)
SHAPES = [
    (576, 576, "q, o"),
    (192, 576, "k, v"),
    (1536, 576, "gate, up"),
    (576, 1536, "down"),
    (8192, 576, "a sixth of the head"),
    (4096, 4096, "long rows"),
]
ACTIVATION_ROWS = (1, 8)
MACS_PER_RUN = 2e8  # multiply-adds a timed run does, whatever the shape


def matrix(qtype: str, rows: int, cols: int, rng: np.random.Generator) -> Matrix:
    raw = random_blocks(rng, rows * cols // ggml.BLOCKS[qtype].elements, qtype)
    packed = PackedTensor(qtype, torch.from_numpy(raw.reshape(rows, -1)), cols)
    return Matrices(torch.device("cpu")).fused([packed])


def best_us(kernel: Matrix, x: torch.Tensor, calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(calls):
            kernel.matmul(x)
        best = min(best, (time.perf_counter() - began) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--types", default="Q4_1,Q8_0")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print("one thread; us a product and G multiply-adds/s, at 1 and 8 activation rows")
    print(f"{'type':6}{'shape':>12}  {'':20}{'us, 1':>9}{'GMAC/s':>8}{'us, 8':>9}{'GMAC/s':>8}")
    for qtype in args.types.split(","):
        for rows, cols, what in SHAPES:
            kernel = matrix(qtype, rows, cols, rng)
            line = f"{qtype:6}{f'{rows}x{cols}':>12}  {what:20}"
            for count in ACTIVATION_ROWS:
                x = torch.randn(count, cols)
                calls = max(20, int(MACS_PER_RUN / (rows * cols * count)))
                us = best_us(kernel, x, calls, args.repeats)
                line += f"{us:9.1f}{rows * cols * count / us / 1e3:8.1f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
