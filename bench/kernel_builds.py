"""Two builds of swarm's kernel module against each other, in one process: both are loaded
from their files and their products called alternately, so that both see the same machine
(on this VM, separate runs of one build differ by more than most kernel changes gain).

Each round runs every product of a model-shaped stack of matrices, each matrix distinct so
that the weights come from memory as in a decode step: `int8` is the embedded model's 30
layers (qkv, o, gate/up, down) and its head as per-row int8; `q4` four layers of the 1B
fixture's shapes as 4-bit codes. Prints the median time of each build and the median of the
per-round ratios. Two copies of one build gave 1.00x at 8 rows and 1.03-1.06x at one row (the
build loaded second ran faster, whichever file it was), so read differences that small at one
row as none.

    python -m bench.kernel_builds BEFORE.so AFTER.so [--weights int8] [--batches 1,8]
        [--threads 1] [--rounds 9]

A build to compare against comes from another checkout: `git worktree add /tmp/before REV`,
then `python setup.py build_ext --inplace` there.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from types import ModuleType

import torch

_INT8_LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
_Q4_LAYER = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)]

Matrix = list[torch.Tensor]  # the kernel's weight arguments, in order


def load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"{name}._kernels", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a loadable module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.use_wide(True)
    return module


def matrices(weights: str) -> list[Matrix]:
    torch.manual_seed(0)
    if weights == "int8":
        shapes = _INT8_LAYER * 30 + [(49152, 576)]
        return [
            [torch.randint(-127, 128, (r, c), dtype=torch.int8), torch.rand(r)] for r, c in shapes
        ]
    return [
        [
            torch.randint(0, 256, (r, c // 2), dtype=torch.uint8),
            (torch.rand(r, c // 32) * 0.01).half(),
            (torch.rand(r, c // 32) * -0.01).half(),
        ]
        for r, c in _Q4_LAYER * 4
    ]


def _width(weights: str, matrix: Matrix) -> int:
    return int(matrix[0].shape[1]) * (1 if weights == "int8" else 2)  # q4: two codes a byte


def one_round(
    module: ModuleType,
    weights: str,
    stack: list[Matrix],
    inputs: dict[int, torch.Tensor],
    threads: int,
) -> float:
    """Seconds for every product of `stack`; `inputs` holds the activations of each width."""
    product = module.i8_matmul if weights == "int8" else module.q4_matmul
    started = time.perf_counter()
    for matrix in stack:
        rows, cols = int(matrix[0].shape[0]), _width(weights, matrix)
        x = inputs[cols]
        batch = int(x.shape[0])
        y = torch.empty(batch, rows)
        product(
            *[m.data_ptr() for m in matrix], x.data_ptr(), y.data_ptr(), rows, cols, batch, threads
        )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--weights", choices=["int8", "q4"], default="int8")
    parser.add_argument("--batches", default="1,8", help="activation rows, comma-separated")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    builds = [load(args.before, "before"), load(args.after, "after")]
    stack = matrices(args.weights)
    print(f"{args.weights} matrices, {args.threads} thread(s), medians of {args.rounds} rounds")
    print(f"{'rows':>5}{'before ms':>11}{'after ms':>10}  speed-up (range)")
    widths = {_width(args.weights, m) for m in stack}
    for batch in (int(b) for b in args.batches.split(",")):
        # made before the rounds: the timed calls do nothing but the products
        inputs = {cols: torch.randn(batch, cols) for cols in widths}
        times: list[list[float]] = [[], []]
        for build in builds:  # first calls fault in the scratch buffer and the code's pages
            one_round(build, args.weights, stack, inputs, args.threads)
        for r in range(args.rounds):
            # each build goes first in every other round, so that neither gains from its place
            for i in (0, 1) if r % 2 == 0 else (1, 0):
                times[i].append(one_round(builds[i], args.weights, stack, inputs, args.threads))
        ratios = [b / a for b, a in zip(times[0], times[1], strict=True)]
        print(
            f"{batch:5}{statistics.median(times[0]) * 1e3:11.2f}"
            f"{statistics.median(times[1]) * 1e3:10.2f}  {statistics.median(ratios):.2f}x"
            f" ({min(ratios):.2f}-{max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()
