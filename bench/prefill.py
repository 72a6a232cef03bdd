"""Prefill overlapped across hops: a long prompt crosses a route of several hops in chunks
(`runtime.prefill_chunk_tokens`), so the next hop computes chunk i while this one computes chunk
i + 1.

Two node processes, each pinned to its own core (sched_setaffinity on every thread) and
serving half the layers, against the sum of their separate prefill times: each hop's compute
for the whole prompt in one step, from the answer's per-hop trace (one process with the whole
model on one core is printed beside it). Time to the first token of a --tokens prompt
(max_tokens 1) through the swarm's HTTP API, chunked and not; median of --repeats.

    python -m bench.prefill [--tokens 1024] [--repeats 3] [--chunk 128]   (needs two cores)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from subprocess import Popen
from typing import Any

from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import free_ports, start_node, stop_nodes, wait_for_coverage
from swarm.inference.local import load_local
from swarm.runtime.execution.model import ModelContext

UNCHUNKED = 1 << 20  # tokens: a chunk size no prompt reaches


def prompt_of(tokens: int, tokenizer: Any) -> str:
    """Plain English text of `tokens` tokens."""
    sentence = "The keeper climbed the tower at dusk and lit the lamp for the ships. "
    ids = tokenizer.encode(sentence * (tokens // 8 + 1), add_special_tokens=False)[:tokens]
    return str(tokenizer.decode(ids))


def pin(process: Popen[bytes], core: int) -> None:
    """Every thread of the process on one core (threads started later inherit it)."""
    for task in os.listdir(f"/proc/{process.pid}/task"):
        os.sched_setaffinity(int(task), {core})


async def one_process(runtime: RuntimeConfig, tokens: int, repeats: int) -> tuple[float, str]:
    """Milliseconds of the whole model's prefill on one core, and the prompt it ran."""
    os.sched_setaffinity(0, {0})
    local = await load_local(runtime)
    try:
        prompt = prompt_of(tokens, local.entry.tokenizer)
        ids = local.entry.encode_text(prompt)
        hidden = await local.compute.run(local.entry.embed, ids)
        times = []
        for i in range(repeats + 1):  # the first warms up
            started = time.perf_counter()
            await local.pipeline.forward(f"p{i}", hidden, 0)  # type: ignore[arg-type]
            times.append((time.perf_counter() - started) * 1000)
            await local.pipeline.close(f"p{i}")  # type: ignore[arg-type]
        return statistics.median(times[1:]), prompt
    finally:
        local.compute.close()
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))


async def swarm_prefill(
    runtime: RuntimeConfig, prompt: str, repeats: int, chunk: int
) -> tuple[float, list[float]]:
    """Milliseconds to the first token through two pinned nodes, entry chunking at `chunk`,
    and each hop's compute for the last step (the whole prompt, unchunked), as its trace
    tells: the nodes' separate prefill times, measured where they run."""
    layers = ModelContext.open(runtime, progress=False).num_layers
    spans = [f"0:{layers // 2}", f"{layers // 2}:{layers}"]
    ports = free_ports(2)
    os.environ["SWARM_RUNTIME_PREFILL_CHUNK_TOKENS"] = str(chunk)  # the entry's setting is the one
    processes: list[Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as state:
        try:
            for i, (port, span) in enumerate(zip(ports, spans, strict=True)):
                join = None if i == 0 else f"127.0.0.1:{ports[0]}"
                flags = ["--span", span, "--threads", "1"]
                processes.append(start_node(port, join, Path(state), runtime, flags))
            await wait_for_coverage(f"127.0.0.1:{ports[0]}", 2, 240)
            for core, process in enumerate(processes):
                pin(process, core)
            client = SwarmClient(f"127.0.0.1:{ports[0]}")
            body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
            times, hops = [], []
            for _ in range(repeats + 1):
                started, trace = time.perf_counter(), {}
                async for event in client.complete(body):
                    trace = event.get("swarm", trace)
                times.append((time.perf_counter() - started) * 1000)
                hops.append([t["compute"] for t in trace.get("hop_timings_ms", [])])
            per_hop = [statistics.median(h) for h in zip(*hops[1:], strict=True)]
            return statistics.median(times[1:]), per_hop
        finally:
            del os.environ["SWARM_RUNTIME_PREFILL_CHUNK_TOKENS"]
            stop_nodes(processes)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--chunk",
        type=int,
        default=RuntimeConfig().prefill_chunk_tokens,
        help="tokens per chunk (default: runtime.prefill_chunk_tokens)",
    )
    args = parser.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("two cores are needed: one per node")
    runtime = RuntimeConfig(threads=1)
    alone, prompt = await one_process(runtime, args.tokens, args.repeats)
    unchunked, separate = await swarm_prefill(runtime, prompt, args.repeats, UNCHUNKED)
    chunked, _ = await swarm_prefill(runtime, prompt, args.repeats, args.chunk)
    both = sum(separate)
    print(f"prefill of {args.tokens} tokens, 2 nodes on a core each, median of {args.repeats}")
    print(f"{'1 process, whole model, 1 core':44}{alone:9.0f} ms")
    hops = " + ".join(f"{ms:.0f}" for ms in separate)
    print(f"{'sum of the two hops computing alone':44}{both:9.0f} ms  ({hops})")
    print(f"{'2 nodes, one step':44}{unchunked:9.0f} ms  {unchunked / both:.2f}x the sum")
    name = f"2 nodes, chunks of {args.chunk} tokens"
    print(f"{name:44}{chunked:9.0f} ms  {chunked / both:.2f}x the sum (target 0.65x)")


if __name__ == "__main__":
    asyncio.run(main())
