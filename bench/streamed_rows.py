"""One-row products from memory, per GGUF block type: a decode step's case at real size.

bench.quant_types times one 4096x4096 matrix called again and again, which a large cache
holds; a decode step reads each matrix once per token, from memory. Here several matrices of
one type (random valid blocks, a 7B model's ffn_down shape by default) are taken in turn, so
that each product reads its weights from memory, and the median ms per product is printed for
the kernel a packed node builds (`Matrices`), then, where the CPU has AVX-512 VNNI, for the
same matrices on their AVX2 rows (the same bits). With --batch N each product takes N
activation rows, a prefill chunk's case, and G multiply-adds a second are printed too.

    python -m bench.streamed_rows [--types Q6_K,Q8_0,Q5_0,Q5_K,Q4_K] [--rows 3584]
        [--cols 18944] [--matrices 4] [--threads 1] [--seconds 3] [--batch 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from harness.block_bytes import random_blocks
from swarm.runtime.weights import ggml, native
from swarm.runtime.weights.packed import Matrices, PackedTensor
from swarm.runtime.weights.quant import Matrix


def matrices(qtype: str, rows: int, cols: int, count: int) -> list[Matrix]:
    kind = ggml.BLOCKS[qtype]
    rng = np.random.default_rng(0)
    built = []
    for _ in range(count):
        raw = random_blocks(rng, rows * cols // kind.elements, qtype)
        packed = PackedTensor(qtype, torch.from_numpy(raw.reshape(rows, -1)), cols)
        built.append(Matrices(torch.device("cpu")).fused([packed]))
    return built


def ms_per_product(built: list[Matrix], cols: int, seconds: float, batch: int = 1) -> float:
    """Median over rounds of the mean ms of one product of `batch` activation rows, the
    matrices taken in turn."""
    x = torch.randn(batch, cols)
    for m in built:
        m.matmul(x)
    rounds: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(rounds) < 3:
        start = time.perf_counter()
        for m in built:
            m.matmul(x)
        rounds.append((time.perf_counter() - start) * 1000 / len(built))
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default="Q6_K,Q8_0,Q5_0,Q5_K,Q4_K")
    parser.add_argument("--rows", type=int, default=3584)
    parser.add_argument("--cols", type=int, default=18944)
    parser.add_argument("--matrices", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    wide_rows = native.available() and native.use_wide(True)
    batch = f"{args.batch} row{'s' * (args.batch > 1)}"
    print(
        f"{args.rows}x{args.cols}, {args.matrices} matrices in turn, torch threads "
        f"{torch.get_num_threads()}, kernels: {native.kernel_name()}, {batch} of activations"
    )
    print(f"| type | kernel | ms, {batch} | GB/s of held bytes | G multiply-adds/s | AVX2 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for qtype in args.types.split(","):
        built = matrices(qtype, args.rows, args.cols, args.matrices)
        ms = ms_per_product(built, args.cols, args.seconds, args.batch)
        avx2 = "-"
        if wide_rows and native.use_wide(False) is False:
            avx2 = f"{ms_per_product(built, args.cols, args.seconds, args.batch):.2f}"
            native.use_wide(True)
        rate = built[0].nbytes / ms / 1e6
        macs = args.rows * args.cols * args.batch / ms / 1e6
        print(
            f"| {qtype} | {type(built[0]).__name__} | {ms:.2f} | {rate:.1f} | {macs:.0f} | {avx2} |"
        )


if __name__ == "__main__":
    main()
