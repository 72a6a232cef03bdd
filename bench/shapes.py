"""One process against llama.cpp on Qwen2.5-shaped files (0.5B, 1.5B, 3B, 7B) in llama.cpp's
Q4_K_M mix, at 1 and 2 threads: decode tokens/s and the prefill of a 512-token prompt, both
sides in one run, plus next-token agreement with float32 of the same weights where float32
fits in memory.

Each row is one `bench.runtime` run in its own process (`--dtypes packed`, llama.cpp through
`llama-bench`, alternating turns, medians), so one shape's memory is gone before the next. The
files are `harness.fixture_7b`'s random valid blocks, typed as llama.cpp's quantizer types a
real file of that shape (0.5B's 896-wide matrices take its 32-weight fallback types), built
once and cached. llama.cpp's tools are built once by `python -m bench.llama_cpp_tools`.

    python -m bench.shapes [--shapes 0.5b,1.5b,3b,7b] [--threads 1,2] [--prompt-tokens 512]
        [--tokens 32] [--repeats 3] [--quality-prompts 8]

A shape this machine has too little memory for is said and skipped, as is the agreement
where its float32 copy does not fit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench import llama_cpp_tools
from harness.fixture_7b import DEFAULT_CACHE, QWEN25_SHAPES, Qwen2Spec, fixture_path

_SWARM = "swarm packed"
_LLAMA = "llama.cpp"
# what a speed row holds at once, in file sizes: swarm's blocks, llama.cpp's mapping of the
# file and the page cache they share, with room for the rest
_SPEED_FILES = 2.5
_FLOAT32_OVERHEAD = 1.3  # float32 weights, the packed copy beside them and the activations


def parameters(spec: Qwen2Spec) -> int:
    h = spec.hidden
    attn = 2 * h * h + 2 * h * spec.kv
    return spec.layers * (attn + 3 * h * spec.ffn) + 2 * spec.vocab * h


@dataclass(frozen=True)
class Row:
    shape: str
    threads: int
    swarm_prefill_s: float
    llama_prefill_s: float
    swarm_decode: float
    llama_decode: float

    def line(self) -> str:
        prefill = self.llama_prefill_s / self.swarm_prefill_s
        decode = self.swarm_decode / self.llama_decode
        return (
            f"| {self.shape} | {self.threads} | {self.swarm_decode:.2f} | {self.llama_decode:.2f} "
            f"| {decode:.2f}x | {self.swarm_prefill_s:.2f} | {self.llama_prefill_s:.2f} "
            f"| {prefill:.2f}x |"
        )


def _runtime(model: Path, extra: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "bench.runtime", "--model", str(model), "--json", str(out)]
        subprocess.run([*command, "--no-transformers", *extra], check=True, stdout=sys.stderr)
        report: dict[str, Any] = json.loads(out.read_text())
        return report


def speed_row(shape: str, model: Path, threads: int, args: argparse.Namespace) -> Row:
    report = _runtime(
        model,
        [
            *("--dtypes", "packed", "--threads", str(threads), "--prompts", "0"),
            *("--prompt-tokens", str(args.prompt_tokens), "--tokens", str(args.tokens)),
            *("--repeats", str(args.repeats)),
        ],
    )
    swarm, llama = report["speed"][_SWARM], report["speed"][_LLAMA]
    return Row(
        shape,
        threads,
        swarm["prefill_s"],
        llama["prefill_s"],
        swarm["decode_tok_s"],
        llama["decode_tok_s"],
    )


def agreement(model: Path, args: argparse.Namespace) -> float:
    report = _runtime(
        model,
        [
            *("--dtypes", "packed,float32", "--prompts", str(args.quality_prompts)),
            *("--quality-tokens", "16", "--tokens", "4", "--repeats", "1"),
        ],
    )
    return float(report["agreement"]["packed"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default=",".join(QWEN25_SHAPES))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quality-prompts", type=int, default=8, help="0 skips agreement")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes if s not in QWEN25_SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}: choose from {', '.join(QWEN25_SHAPES)}")
    if llama_cpp_tools.built() is None:
        sys.exit("llama.cpp's tools are not built: python -m bench.llama_cpp_tools")

    rows: list[Row] = []
    agreements: dict[str, str] = {}
    for shape in shapes:
        spec = QWEN25_SHAPES[shape]
        model = fixture_path(spec, args.cache)
        size = model.stat().st_size
        available = psutil.virtual_memory().available
        if size * _SPEED_FILES > available:
            print(f"{shape}: skipped, {size / 2**30:.1f} GiB file, {available / 2**30:.1f} free")
            continue
        for threads in (int(t) for t in args.threads.split(",")):
            rows.append(speed_row(shape, model, threads, args))
            print(rows[-1].line(), flush=True)
        float32 = parameters(spec) * 4 * _FLOAT32_OVERHEAD
        if not args.quality_prompts:
            agreements[shape] = "not run"
        elif float32 > psutil.virtual_memory().available:
            agreements[shape] = f"float32 ({float32 / 2**30:.0f} GiB) does not fit here"
        else:
            agreements[shape] = f"{agreement(model, args):.1%}"

    print(f"\none process against llama.cpp, prompt {args.prompt_tokens} tokens, medians")
    print("| shape | threads | swarm tok/s | llama.cpp tok/s | decode | swarm prefill s ", end="")
    print("| llama.cpp prefill s | prefill |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(row.line())
    print("\nnext-token agreement of the packed path with float32 of the same weights:")
    for shape, said in agreements.items():
        print(f"  {shape}: {said}")


if __name__ == "__main__":
    main()
