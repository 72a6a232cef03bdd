"""The stall a client sees when a hop is killed (-9) in the middle of its decode.

Four node processes on loopback, two stages of two replicas (every layer has two servers). One
greedy stream per prefix length; after a few tokens the non-entry hop on its route is killed.
The stall is split into detection (kill to the entry giving up on the step, from the entry's
failover trace) and replay (the prefill of the whole session so far on the new route), next to
the normal gap between tokens. The killed node is restarted between runs.

    python -m bench.failover [--prefixes 32,256,1024] [--tokens 16]   (run as a module from the
    repository root)
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from subprocess import Popen
from typing import Any

from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import free_ports, start_node, stop_nodes, wait_for_coverage
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.text.tokenizer import load_tokenizer

SENTENCE = "The lighthouse keeper wrote in his log every night, whatever the weather. "
KILL_AFTER = 4  # tokens streamed before the kill


def prompt_of(context: ModelContext, tokens: int) -> str:
    """A user message whose chat prompt is about `tokens` tokens long."""
    per_sentence = len(load_tokenizer(context.store.tokenizer_folder).encode(SENTENCE))
    return SENTENCE * max(1, tokens // per_sentence)


async def kill_middle_hop(
    client: SwarmClient, addresses: list[str], processes: list[Popen[bytes]]
) -> int:
    """kill -9 the node on the entry's first session route that is not the entry itself."""
    status = await client.status()
    me = status.node.id
    where = {m.id: m.address for m in status.members}
    node = next(n for n in status.sessions[0].route if n != me)
    victim = addresses.index(where[node])
    processes[victim].kill()
    return victim


async def one_run(
    client: SwarmClient, prompt: str, tokens: int, kill: Callable[[], Awaitable[int]]
) -> dict[str, float]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens}
    stamps: list[float] = []
    killed_at = killed_wall = 0.0
    victim = -1
    trace: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    async for chunk in client.chat({**body, "temperature": 0}):
        if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
            stamps.append(time.perf_counter())
            if len(stamps) == KILL_AFTER:
                killed_at, killed_wall = time.perf_counter(), time.time()
                victim = await kill()
        if "error" in chunk:
            raise RuntimeError(f"the stream failed: {chunk['error']}")
        trace = chunk.get("swarm", trace)
        usage = chunk.get("usage") or usage
    failover = trace["failovers"][0]
    after = next(s for s in stamps if s > killed_at)
    before = [b - a for a, b in itertools.pairwise(stamps) if b <= killed_at]
    return {
        "victim": victim,
        "prefix": usage.get("prompt_tokens", 0) + KILL_AFTER,
        "gap_ms": statistics.median(before) * 1000,
        "detect_ms": (failover["detected_at"] - killed_wall) * 1000,
        "replay_ms": failover["replay_ms"],
        "stall_ms": (after - killed_at) * 1000,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prefixes", default="32,256,1024")
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    runtime = RuntimeConfig(threads=1)
    context = ModelContext.open(runtime, progress=False)
    # two stages of two replicas, pinned: every layer has a second server to fail over to
    spans = ("0:15", "15:30", "0:15", "15:30")
    ports = free_ports(4)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    processes: list[Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)

        def start(i: int) -> None:
            join = None if i == 0 else addresses[0]
            flags = ["--span", spans[i], "--threads", "1"]
            process = start_node(ports[i], join, state, runtime, flags)
            processes[i : i + 1] = [process]

        try:
            for i in range(4):
                start(i)
            await wait_for_coverage(addresses[0], 4, 240)
            client = SwarmClient(addresses[0])
            rows = []
            for prefix in (int(p) for p in args.prefixes.split(",")):
                row = await one_run(
                    client,
                    prompt_of(context, prefix),
                    args.tokens,
                    lambda: kill_middle_hop(client, addresses, processes),
                )
                rows.append(row)
                start(int(row["victim"]))
                await wait_for_coverage(addresses[0], 4, 240)
        finally:
            stop_nodes(processes)
    print("kill -9 of a middle hop during decode; 4 nodes, every layer on two of them")
    print(f"{'prefix tok':>10}{'gap ms':>9}{'detect ms':>11}{'replay ms':>11}{'stall ms':>10}")
    for r in rows:
        print(
            f"{r['prefix']:>10}{r['gap_ms']:9.1f}{r['detect_ms']:11.1f}"
            f"{r['replay_ms']:11.1f}{r['stall_ms']:10.1f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
