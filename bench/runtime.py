"""Runtime speed in one run: swarm's runtime from packed GGUF blocks, in float32, bfloat16 and
int8 against transformers generate and llama.cpp, each against its memory-bandwidth roofline,
plus where a decode step's time goes and how closely each follows float32.

Everything runs in one process on one compute thread (a second thread doing torch work makes
libgomp throttle both), with the same prompt and thread count. Speed runs alternate between
runtimes and report medians, because these machines are noisy; the ratios are what count.

* swarm: the real generation loop (compute thread, KV cache, whole model as one shard);
  `packed-torch` is packed on torch's int4/int8 kernels instead of swarm's own, `packed-avx2`
  on swarm's kernels held to their AVX2 rows where the CPU has AVX-512 VNNI (the same bits),
  `packed-stepwise` with each decoder layer's decode step as a call per norm, product and
  attention instead of one call per layer (the same bits).
* transformers: generate(do_sample=False) in float32 and bfloat16 (it has no CPU int8 path
  without extra libraries).
* llama.cpp: llama-cpp-python on the same GGUF file, when installed. That file is Q4_1 with a
  Q8_0 embedding/head, which llama.cpp runs natively: it reads fewer bytes per token than int8.
  Where llama-cpp-python is absent but llama.cpp's tools are built (`python -m
  bench.llama_cpp_tools`), `llama-bench` runs instead, one run per turn: its prompt figure
  (`-p` the prompt's length) and its generation figure (`-n` tokens from an empty context).
* roofline: measured read bandwidth / bytes of weights read per token (decoder + head).
* quality: int8 (and bfloat16) next-token top-1 agreement with float32, teacher-forced on the
  float32 greedy tokens.

    python -m bench.runtime [--model smollm2-135m-instruct | fixture-1b | PATH]
        [--dtypes packed,float32,bfloat16,int8,packed-torch,packed-avx2,packed-stepwise]
        [--tokens 64] [--repeats 3]
        [--threads 0] [--prompts 50] [--quality-tokens 32] [--no-transformers]
        [--prompt-tokens N]   (the prompt's tokens repeated to N, e.g. 512 for prefill)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench import llama_cpp_tools
from bench.decode_profile import GROUPS, profile_decode
from harness.quality import Runtime, agreement, prompt_ids, prompts, references
from swarm.config import RuntimeConfig, load_config
from swarm.inference.generation import Chunk, generate
from swarm.inference.local import LocalSwarm
from swarm.inference.pipeline import LocalPipeline
from swarm.runtime.checkpoint.source import resolve_model
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.weights import native
from swarm.sampling_settings import SamplingSettings
from swarm.telemetry import bytes_per_layer
from swarm.types import LayerSpan

PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."
Result = tuple[float, float, int]  # prefill seconds, decode tokens/s, tokens generated


async def swarm_run(local: LocalSwarm, ids: list[int], tokens: int) -> Result:
    params = SamplingSettings(max_tokens=tokens)
    start = time.perf_counter()
    stamps: list[float] = []
    async for event in generate(local.entry, local.pipeline, local.compute, ids, params):
        if isinstance(event, Chunk) and event.token_id is not None:
            stamps.append(time.perf_counter())
    return stamps[0] - start, (len(stamps) - 1) / (stamps[-1] - stamps[0]), len(stamps)


def hf_run(model: Any, ids: list[int], tokens: int) -> Result:
    tensor = torch.tensor([ids])
    mask = torch.ones_like(tensor)
    with torch.inference_mode():
        start = time.perf_counter()
        model.generate(tensor, attention_mask=mask, max_new_tokens=1, do_sample=False)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(tensor, attention_mask=mask, max_new_tokens=tokens, do_sample=False)
        total = time.perf_counter() - start
    produced = out.shape[1] - tensor.shape[1]
    return prefill, (produced - 1) / (total - prefill), produced


class LlamaCpp:
    """llama.cpp in a worker process (bench.llama_cpp_worker), driven line by line."""

    def __init__(self, path: Path, threads: int, scoring: bool = False) -> None:
        self.path, self.threads = path, threads
        mode = ["score"] if scoring else []
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.llama_cpp_worker", str(path), str(threads), *mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self._readline() != "ready":
            raise RuntimeError("the llama.cpp worker did not start")

    def _readline(self) -> str:
        assert self._proc.stdout is not None  # set by PIPE
        return self._proc.stdout.readline().strip()

    def run(self, ids: list[int], tokens: int) -> Result:
        assert self._proc.stdin is not None  # set by PIPE
        self._proc.stdin.write(f"{tokens} {','.join(map(str, ids))}\n")
        self._proc.stdin.flush()
        prefill, rate, produced = self._readline().split()
        return float(prefill), float(rate), int(produced)

    def score(self, sequence: list[int], steps: int) -> list[int]:
        """The top-1 next token at each of the last `steps` positions (teacher-forced)."""
        assert self._proc.stdin is not None  # set by PIPE
        self._proc.stdin.write(f"score {steps} {','.join(map(str, sequence))}\n")
        self._proc.stdin.flush()
        return [int(t) for t in self._readline().split()]

    def agreement(self, sequences: list[list[int]], steps: int) -> float:
        same = sum(
            a == b
            for seq in sequences
            for a, b in zip(self.score(seq, steps), seq[-steps:], strict=True)
        )
        return same / (steps * len(sequences))

    def close(self) -> None:
        self._proc.kill()
        self._proc.wait()


class LlamaBench:
    """llama.cpp's own `llama-bench` on the same file, one run per call: the prompt's length
    as its prompt test and `tokens` as its generation test (from an empty context)."""

    def __init__(self, tools: llama_cpp_tools.Tools, path: Path, threads: int) -> None:
        self.tools, self.path, self.threads = tools, path, threads

    def run(self, ids: list[int], tokens: int) -> Result:
        command = [str(self.tools.bench), "-m", str(self.path), "-t", str(self.threads)]
        command += ["-p", str(len(ids)), "-n", str(tokens), "-r", "1", "-o", "json"]
        done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=1800)
        rates = {(row["n_prompt"], row["n_gen"]): row["avg_ts"] for row in json.loads(done.stdout)}
        prefill = len(ids) / float(rates[(len(ids), 0)])
        return prefill, float(rates[(0, tokens)]), tokens


def load_hf(runtime: RuntimeConfig) -> Any:
    from transformers import AutoModelForCausalLM

    source = resolve_model(runtime.model)
    dtype = getattr(torch, runtime.dtype)
    if source.path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(
            str(source.path.parent), gguf_file=source.path.name, dtype=dtype
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(str(source.path), dtype=dtype)
    return model.eval()


def gguf_path(model: str) -> Path | None:
    source = resolve_model(model)
    return source.path if source.path.suffix == ".gguf" else None


def gguf_bytes_per_token(path: Path) -> int:
    """Bytes llama.cpp reads per token: every block tensor, the (tied) output matrix, norms."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)


def swarm_bytes_per_token(local: LocalSwarm) -> int:
    context = local.pipeline.shards[0].context
    return bytes_per_layer(context) * context.num_layers + local.entry.head_bytes


def read_bandwidth(gib: float = 1.0, rounds: int = 5) -> float:
    """Bytes/s of summing a buffer larger than the caches, on torch's threads (best of rounds)."""
    buffer = torch.ones(int(gib * 2**30) // 4)
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        buffer.sum()
        best = max(best, buffer.nbytes / (time.perf_counter() - start))
    return best


def load_swarm(runtime: RuntimeConfig) -> tuple[EntryModel, Shard]:
    context = ModelContext.open(runtime)
    return EntryModel(context), Shard.load(context, LayerSpan(0, context.num_layers), runtime)


@dataclasses.dataclass
class Contender:
    name: str
    weights: str
    run: Callable[[int], Any]  # tokens -> awaitable Result
    bytes_per_token: int | None = None
    results: list[Result] = dataclasses.field(default_factory=list)

    def median(self, i: int) -> float:
        return statistics.median(r[i] for r in self.results)


PACKED_ON_TORCH = "packed-torch"  # --dtypes: packed, on torch's kernels instead of swarm's
PACKED_ON_AVX2 = "packed-avx2"  # --dtypes: packed, swarm's kernels on their AVX2 rows only
# --dtypes: packed, each decoder layer step by step (a call per norm, product, ...) instead of one
PACKED_STEPWISE = "packed-stepwise"
WEIGHTS = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "int8": "int8 layers, fp32 head",
    "packed": "GGUF blocks: swarm's kernels",
    PACKED_ON_TORCH: "GGUF blocks: torch's int4 / int8",
    PACKED_ON_AVX2: "GGUF blocks: swarm's kernels, AVX2",
    PACKED_STEPWISE: "GGUF blocks: swarm's kernels, layers step by step",
}


def _runtime_of(base: RuntimeConfig, dtype: str) -> RuntimeConfig:
    """The runtime config that loads `dtype`: matrices pick their kernel when they are built,
    so PACKED_ON_TORCH loads with swarm's kernels off and both run side by side."""
    variants = (PACKED_ON_TORCH, PACKED_ON_AVX2, PACKED_STEPWISE)
    config_dtype = "packed" if dtype in variants else dtype
    return dataclasses.replace(
        base,
        dtype=config_dtype,  # type: ignore[arg-type]  # a typo: ConfigError
        native_kernels=dtype != PACKED_ON_TORCH,
        dense_layers=dtype != PACKED_STEPWISE,
    )


FIXTURE_1B = "fixture-1b"  # --model: the seeded ~1.2B Q4_K_M-like GGUF of harness.gguf_fixture


async def build(
    args: argparse.Namespace,
    compute: ComputeThread,
    ids: list[int],
    closers: list[Callable[[], None]],
) -> tuple[list[Contender], dict[str, LocalSwarm], LlamaCpp | None]:
    base = load_config(
        overrides={"runtime": {"model": args.model, "threads": args.threads}}
    ).runtime
    contenders: list[Contender] = []
    swarms: dict[str, LocalSwarm] = {}
    llm: LlamaCpp | None = None
    for dtype in args.dtypes.split(","):
        runtime = _runtime_of(base, dtype)
        entry, shard = await compute.run(load_swarm, runtime)
        pipeline = LocalPipeline([shard], compute, runtime.prefill_chunk_tokens)
        local = LocalSwarm(entry, pipeline, compute)
        swarms[dtype] = local

        async def run_swarm(
            tokens: int, local: LocalSwarm = local, wide: bool = dtype != PACKED_ON_AVX2
        ) -> Result:
            if native.available():  # the rows are chosen per call, so set before each run
                native.use_wide(wide)
            return await swarm_run(local, ids, tokens)

        contenders.append(
            Contender(f"swarm {dtype}", WEIGHTS[dtype], run_swarm, swarm_bytes_per_token(local))
        )
        packed = ("int8", "packed", PACKED_ON_TORCH, PACKED_ON_AVX2, PACKED_STEPWISE)
        if dtype not in packed and not args.no_transformers:
            hf = await compute.run(load_hf, runtime)
            contenders.append(
                Contender(
                    f"transformers {dtype}",
                    WEIGHTS[dtype],
                    lambda tokens, hf=hf: compute.run(hf_run, hf, ids, tokens),
                )
            )
    path = gguf_path(args.model)
    if path is not None and importlib.util.find_spec("llama_cpp") is not None:
        llm = llama = LlamaCpp(path, await compute.run(torch.get_num_threads))
        closers.append(llama.close)
        contenders.append(
            Contender(
                "llama.cpp",
                "GGUF blocks (native)",
                lambda tokens: asyncio.to_thread(llama.run, ids, tokens),
                gguf_bytes_per_token(path),
            )
        )
    elif path is not None and (tools := llama_cpp_tools.built()) is not None:
        bench = LlamaBench(tools, path, await compute.run(torch.get_num_threads))
        contenders.append(
            Contender(
                "llama.cpp",
                "GGUF blocks (native, llama-bench)",
                lambda tokens: asyncio.to_thread(bench.run, ids, tokens),
                gguf_bytes_per_token(path),
            )
        )
    else:
        why = "the model is not a GGUF file" if path is None else "llama-cpp-python is absent"
        print(f"llama.cpp: not measured ({why}; pip install llama-cpp-python==0.3.36)")
    return contenders, swarms, llm


def print_speed(contenders: list[Contender], bandwidth: float) -> None:
    llama = next((c for c in contenders if c.name == "llama.cpp"), None)
    print(
        f"{'runtime':22}{'weights':38}{'prefill ms':>11}{'decode tok/s':>13}"
        f"{'roofline':>10}{'of roof':>9}{'vs llama.cpp':>13}"
    )
    for c in contenders:
        rate = c.median(1)
        roof = bandwidth / c.bytes_per_token if c.bytes_per_token else None
        print(
            f"{c.name:22}{c.weights:38}{c.median(0) * 1000:11.1f}{rate:13.1f}"
            + (f"{roof:10.1f}{rate / roof:9.0%}" if roof else f"{'-':>10}{'-':>9}")
            + (f"{rate / llama.median(1):12.2f}x" if llama else f"{'-':>13}")
        )
    by_name = {c.name: c for c in contenders}
    for c in contenders:
        dtype = c.name.removeprefix("swarm ")
        other = by_name.get(f"transformers {dtype}") or by_name.get("transformers float32")
        if c.name.startswith("swarm") and other:
            print(
                f"ratio {c.name} / {other.name}: decode {c.median(1) / other.median(1):.2f}x, "
                f"prefill {other.median(0) / c.median(0):.2f}x faster"
            )


def print_profile(profiles: dict[str, dict[str, float]]) -> None:
    print("\nwhere a decode step goes, ms per token (torch.profiler self time, so slower)")
    print(f"{'':30}" + "".join(f"{d:>13}" for d in profiles))
    for group in (*GROUPS, "total"):
        print(f"{group:30}" + "".join(f"{p[group]:13.2f}" for p in profiles.values()))


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtypes", default="packed,float32,bfloat16,int8")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=50, help="for the quality check; 0 skips")
    parser.add_argument("--quality-tokens", type=int, default=32)
    parser.add_argument("--no-transformers", action="store_true", help="skip transformers runs")
    parser.add_argument("--prompt-tokens", type=int, default=0, help="the prompt repeated to N")
    parser.add_argument("--json", type=Path, help="also write the medians and agreements here")
    args = parser.parse_args()
    if args.model == FIXTURE_1B:
        from harness.gguf_fixture import LLAMA_1B, fixture_path
        from harness.paths import FIXTURES

        args.model = str(fixture_path(LLAMA_1B, FIXTURES))
    for dtype in args.dtypes.split(","):
        _runtime_of(RuntimeConfig(), dtype)  # a typo: ConfigError

    compute = ComputeThread(args.threads)
    closers: list[Callable[[], None]] = [compute.close]
    try:
        await run_all(args, compute, closers)
    finally:
        for close in closers:
            close()


async def run_all(
    args: argparse.Namespace, compute: ComputeThread, closers: list[Callable[[], None]]
) -> None:
    probe = await compute.run(ModelContext.open, RuntimeConfig(model=args.model))
    tokenizer_entry = await compute.run(EntryModel, probe)
    ids = prompt_ids(tokenizer_entry, PROMPT)
    if args.prompt_tokens:
        ids = (ids * (args.prompt_tokens // len(ids) + 1))[: args.prompt_tokens]
    contenders, swarms, llm = await build(args, compute, ids, closers)
    threads = await compute.run(torch.get_num_threads)
    bandwidth = await compute.run(read_bandwidth)
    for c in contenders:  # warm-up
        await c.run(4)
    for _ in range(args.repeats):
        for c in contenders:
            c.results.append(await c.run(args.tokens))

    print(
        f"model {args.model}, torch threads {threads}, prompt {len(ids)} tokens, "
        f"{args.tokens} new tokens, median of {args.repeats}"
    )
    print(f"memory read bandwidth {bandwidth / 1e9:.1f} GB/s (sum of 1 GiB, {threads} threads)")
    print_speed(contenders, bandwidth)
    report: dict[str, Any] = {
        "threads": threads,
        "prompt_tokens": len(ids),
        "speed": {
            c.name: {"prefill_s": c.median(0), "decode_tok_s": c.median(1)} for c in contenders
        },
        "agreement": {},
    }

    runtimes = {d: Runtime(s.entry, s.pipeline.shards[0]) for d, s in swarms.items()}
    profiles = {d: await compute.run(profile_decode, r, ids, 16) for d, r in runtimes.items()}
    print_profile(profiles)

    if args.prompts and "float32" in runtimes:
        texts = prompts(args.prompts)
        steps = args.quality_tokens
        sequences = await compute.run(references, runtimes["float32"], texts, steps)
        print(f"\nnext-token top-1 agreement with float32, {len(texts)} prompts x {steps} tokens")
        for d, r in runtimes.items():
            if d != "float32":
                score = await compute.run(agreement, r, sequences, steps)
                report["agreement"][d] = score
                print(f"{d:10}{score:8.1%}")
        if llm is not None:
            scorer = LlamaCpp(llm.path, llm.threads, scoring=True)
            closers.append(scorer.close)
            score = await asyncio.to_thread(scorer.agreement, sequences, steps)
            report["agreement"]["llama.cpp"] = score
            print(f"{'llama.cpp':10}{score:8.1%}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
