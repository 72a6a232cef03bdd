"""Runtime speed against transformers, side by side in one process.

For the same model, dtype, prompt and thread count, measures prefill time and greedy decode
tokens/s of (a) swarm's runtime through its real generation loop (compute thread, KV cache,
whole model as one shard) and (b) transformers' generate(do_sample=False). Runs alternate
A, B, A, B and report medians, because these machines are noisy; the ratio is what counts.

    python -m bench.runtime [--dtype float32] [--tokens 64] [--repeats 3] [--threads 0]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import torch

from swarm.config import RuntimeConfig, load_config
from swarm.inference.generation import Chunk, generate
from swarm.inference.local import LocalSwarm, load_local
from swarm.runtime.sampling import SamplingParams
from swarm.runtime.source import resolve_model

PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."


async def swarm_run(local: LocalSwarm, ids: list[int], tokens: int) -> tuple[float, float, int]:
    """(prefill seconds, decode tokens/s, tokens generated) through the generation loop."""
    params = SamplingParams(max_tokens=tokens)
    start = time.perf_counter()
    stamps: list[float] = []
    async for event in generate(local.entry, local.pipeline, local.compute, ids, params):
        if isinstance(event, Chunk) and event.token_id is not None:
            stamps.append(time.perf_counter())
    prefill = stamps[0] - start
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    return prefill, rate, len(stamps)


def hf_run(model: Any, ids: torch.Tensor, tokens: int) -> tuple[float, float, int]:
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        start = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=False)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=tokens, do_sample=False)
        total = time.perf_counter() - start
    produced = out.shape[1] - ids.shape[1]
    return prefill, (produced - 1) / (total - prefill), produced


def load_hf(runtime: RuntimeConfig) -> Any:
    from transformers import AutoModelForCausalLM

    source = resolve_model(runtime.model)
    if source.path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(
            str(source.path.parent), gguf_file=source.path.name, dtype=getattr(torch, runtime.dtype)
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(
            str(source.path), dtype=getattr(torch, runtime.dtype)
        )
    return model.eval()


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()

    runtime = load_config(
        overrides={"runtime": {"model": args.model, "dtype": args.dtype, "threads": args.threads}}
    ).runtime
    local = await load_local(runtime)
    # Everything torch runs on the one compute thread: a second thread doing torch work
    # creates a second OpenMP team, and libgomp then throttles both (~40% slower decode).
    hf = await local.compute.run(load_hf, runtime)
    ids = local.entry.encode_chat([{"role": "user", "content": PROMPT}])
    ids_tensor = torch.tensor([ids])
    results: dict[str, list[tuple[float, float, int]]] = {"swarm": [], "transformers": []}
    try:
        await swarm_run(local, ids, 4)  # warm-up both
        await local.compute.run(hf_run, hf, ids_tensor, 4)
        for _ in range(args.repeats):
            results["swarm"].append(await swarm_run(local, ids, args.tokens))
            results["transformers"].append(
                await local.compute.run(hf_run, hf, ids_tensor, args.tokens)
            )
    finally:
        local.compute.close()

    print(
        f"model {args.model}, dtype {args.dtype}, torch threads {torch.get_num_threads()}, "
        f"prompt {len(ids)} tokens, {args.tokens} new tokens, median of {args.repeats}"
    )
    print(f"{'':14}{'prefill ms':>12}{'decode tok/s':>14}{'tokens':>8}")
    medians = {}
    for name, rows in results.items():
        prefill = statistics.median(r[0] for r in rows) * 1000
        rate = statistics.median(r[1] for r in rows)
        medians[name] = (prefill, rate)
        print(f"{name:14}{prefill:12.1f}{rate:14.1f}{rows[0][2]:8d}")
    s, t = medians["swarm"], medians["transformers"]
    print(
        f"ratio swarm/transformers: decode {s[1] / t[1]:.2f}x faster, "
        f"prefill {t[0] / s[0]:.2f}x faster"
    )


if __name__ == "__main__":
    asyncio.run(main())
