"""What a mixture-of-experts decode step costs with the experts it routes to, against the same
layers computing every expert: a seeded Qwen3-MoE written as GGUF (its experts in --qtype),
run once as it is (top --top-k) and once with every expert chosen (top k = all experts, the
same weights and file otherwise). Prints ms per decode step through all layers, one session
and --batch sessions (`Shard.decode_batch`: rows grouped by expert), medians of --repeats.

    python -m bench.moe_decode [--experts 32] [--top-k 2] [--qtype Q8_0] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import torch

from harness.family_models import SPECS, build_model, write_gguf
from swarm.config import RuntimeConfig
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.types import LayerSpan, SessionId


def _step_ms(path: Path, cache: Path, threads: int, batch: int, steps: int) -> float:
    runtime = RuntimeConfig(model=str(path), cache_dir=cache, threads=threads)
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    span = LayerSpan(0, context.num_layers)
    shard = Shard.load(context, span, runtime)
    sessions = [SessionId(f"s{i}") for i in range(batch)]
    for i, session in enumerate(sessions):
        shard.forward(session, entry.embed([1, *range(10 + i, 40 + i)]), 0)
    start = time.perf_counter()
    for step in range(steps):
        rows = [(s, entry.embed([20 + i + step]), 31 + step) for i, s in enumerate(sessions)]
        if batch == 1:
            shard.forward(*rows[0])
        else:
            shard.decode_batch(rows, span)
    return (time.perf_counter() - start) * 1000 / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--inner", type=int, default=256)  # each expert's intermediate size
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--qtype", default="Q8_0")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = SPECS["qwen3_moe"]
    shape = dict(
        hidden_size=args.hidden,
        moe_intermediate_size=args.inner,
        num_experts=args.experts,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=args.hidden // 8,
    )
    root = Path(tempfile.mkdtemp(prefix="moe-bench-"))
    files = {}
    for label, top_k in (("routed", args.top_k), ("every expert", args.experts)):
        overrides = {**base.overrides, **shape, "num_experts_per_tok": top_k}
        spec = dataclasses.replace(base, layers=args.layers, overrides=overrides)
        path = root / f"top{top_k}.gguf"
        files[label] = write_gguf(build_model(spec), spec, path, expert_type=args.qtype)
    print(
        f"Qwen3-MoE, {args.layers} layers, hidden {args.hidden}, {args.experts} experts of "
        f"{args.inner}, {args.qtype} experts, {args.threads} thread(s); ms per decode step, "
        f"medians of {args.repeats}"
    )
    print("| experts computed | 1 session | batch | batch / 1 |")
    print("| --- | --- | --- | --- |")
    for label, path in files.items():
        one, many = [], []
        for _ in range(args.repeats):  # each run on fresh shards: caches start empty
            one.append(_step_ms(path, root / "cache", args.threads, 1, args.steps))
            many.append(_step_ms(path, root / "cache", args.threads, args.batch, args.steps))
        a, b = statistics.median(one), statistics.median(many)
        top_k = args.top_k if label == "routed" else args.experts
        print(
            f"| {label} (top {top_k}) | {a:.2f} | {b:.2f} ({args.batch} sessions) | {b / a:.2f} |"
        )


if __name__ == "__main__":
    main()
