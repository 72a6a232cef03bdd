"""Swarm decode speed on loopback against one process running the same runtime.

For 1, 2 and 3 node processes (memory limits force a split into that many hops), and for one
process with the whole model, all with one torch thread each: greedy decode tokens/s of one
stream as the client sees it, the ratio to one process, and the overhead each hop adds
((swarm ms per token - one-process ms per token) / hops). Median of --repeats runs each.

    python -m bench.swarm [--tokens 48] [--repeats 3]   (as a module: bench/swarm.py as a
    script would shadow the swarm package)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import free_ports, start_node, stop_nodes, wait_for_coverage
from swarm.inference.generation import Chunk, generate
from swarm.inference.local import load_local
from swarm.runtime.model import ModelContext
from swarm.runtime.sampling import SamplingParams
from swarm.telemetry import bytes_per_layer

PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."


def _rate(stamps: list[float]) -> float:
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


async def one_process(runtime: RuntimeConfig, tokens: int, repeats: int) -> float:
    local = await load_local(runtime)
    try:
        ids = local.entry.encode_chat([{"role": "user", "content": PROMPT}])
        rates = []
        for _ in range(repeats + 1):  # the first run warms up
            stamps = []
            async for event in generate(
                local.entry, local.pipeline, local.compute, ids, SamplingParams(max_tokens=tokens)
            ):
                if isinstance(event, Chunk) and event.token_id is not None:
                    stamps.append(time.perf_counter())
            rates.append(_rate(stamps))
        return statistics.median(rates[1:])
    finally:
        local.compute.close()


async def swarm_of(
    n: int, runtime: RuntimeConfig, tokens: int, repeats: int
) -> tuple[float, list[dict]]:  # type: ignore[type-arg]
    context = ModelContext.open(runtime, progress=False)
    per_node = context.num_layers if n == 1 else -(-context.num_layers // n) + 1
    flags = ["--layer-memory-bytes", str(per_node * bytes_per_layer(context)), "--threads", "1"]
    ports = free_ports(n)
    processes = []
    with tempfile.TemporaryDirectory() as state:
        try:
            for i, port in enumerate(ports):
                join = None if i == 0 else f"127.0.0.1:{ports[0]}"
                processes.append(start_node(port, join, Path(state), runtime, flags))
            await wait_for_coverage(f"127.0.0.1:{ports[0]}", n, 240)
            client = SwarmClient(f"127.0.0.1:{ports[0]}")
            body = {
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": tokens,
                "temperature": 0,
            }
            rates, trace = [], []
            for _ in range(repeats + 1):
                stamps = []
                async for chunk in client.chat(body):
                    if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                        stamps.append(time.perf_counter())
                    trace = chunk.get("swarm", {}).get("route", trace)
                rates.append(_rate(stamps))
            return statistics.median(rates[1:]), trace
        finally:
            stop_nodes(processes)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    runtime = RuntimeConfig(threads=1)
    if args.cache_dir:
        runtime = RuntimeConfig(threads=1, cache_dir=Path(args.cache_dir))
    base = await one_process(runtime, args.tokens, args.repeats)
    print(f"greedy decode, {args.tokens} tokens, one torch thread per process, ", end="")
    print(f"median of {args.repeats}")
    print(f"{'setup':14}{'tok/s':>8}{'ms/token':>10}{'vs 1 process':>14}", end="")
    print(f"{'overhead/hop ms':>17}  route")
    print(f"{'1 process':14}{base:8.1f}{1000 / base:10.1f}{1.0:14.2f}{'-':>17}")
    for n in (1, 2, 3):
        rate, route = await swarm_of(n, runtime, args.tokens, args.repeats)
        overhead = (1000 / rate - 1000 / base) / n
        spans = " -> ".join(f"{h['layers'][0]}:{h['layers'][1]}" for h in route)
        name = f"{n} node(s)"
        print(f"{name:14}{rate:8.1f}{1000 / rate:10.1f}{rate / base:14.2f}", end="")
        print(f"{overhead:17.2f}  {spans}")


if __name__ == "__main__":
    asyncio.run(main())
