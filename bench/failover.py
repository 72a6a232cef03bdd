"""The stall a client sees when a hop is killed (-9) in the middle of its decode.

Four node processes on loopback, two stages of two replicas (every layer has two servers). One
greedy stream per prefix length; after a few tokens the non-entry hop on its route is killed.
The stall is split into detection (kill to the entry giving up on the step, from the entry's
failover trace) and replay (the prefill of the whole session so far on the new route), next to
the normal gap between tokens. The killed node is restarted between runs.

With --streams N: N concurrent greedy streams, all routed through one hop (three nodes: the
entry, serving no layers or --entry-layers, a hop with the rest, and a spare for the rest that
starts once every stream has its route), the hop killed once every stream decodes.
Every stream replays on the spare at once; each one's stall (its longest wait for a token after
the kill) is printed, for replays run one at a time at each hop (runtime.prefill_batch_tokens =
0) and batched.

    python -m bench.failover [--prefixes 32,256,1024] [--tokens 16]
    python -m bench.failover --streams 8 [--tokens 48] [--rounds 2] [--entry-layers 0:15]
    (run as modules from the repository root)
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from subprocess import Popen
from typing import Any

from harness.replays import Replayed, concurrent_replays
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


def lab_flags(entry_layers: str, layers: int) -> list[list[str]]:
    """Flags of the entry, the hop and the spare: the entry serves `entry_layers` ("a:b") and
    the hop and the spare the rest, or ("") the entry serves no layers at all (one byte of
    layer memory) and they serve every layer."""
    rest = f"{entry_layers.partition(':')[2]}:{layers}" if entry_layers else f"0:{layers}"
    entry = ["--span", entry_layers] if entry_layers else ["--layer-memory-bytes", "1"]
    return [entry, ["--span", rest], ["--span", rest]]


async def concurrent_lab(
    runtime: RuntimeConfig,
    prompts: Sequence[str],
    tokens: int,
    batch_tokens: int,
    entry_layers: str,
) -> list[Replayed]:
    """Three node processes (the entry, the hop and, later, the spare) and one round."""
    ports = free_ports(3)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    processes: list[Popen[bytes]] = []
    layers = ModelContext.open(runtime, progress=False).num_layers
    flags = lab_flags(entry_layers, layers)
    serving = 2 if entry_layers else 1  # members serving layers before the spare starts
    with tempfile.TemporaryDirectory() as tmp:

        def start(i: int) -> None:
            more = ["--threads", "1", "--prefill-batch-tokens", str(batch_tokens)]
            join = None if i == 0 else addresses[0]
            processes.append(start_node(ports[i], join, Path(tmp), runtime, flags[i] + more))

        async def start_spare() -> None:
            start(2)
            await wait_for_coverage(addresses[0], serving + 1, 240)

        try:
            start(0)
            start(1)
            await wait_for_coverage(addresses[0], serving, 240)
            return await concurrent_replays(
                addresses[0], prompts, tokens, start_spare, processes[1].kill
            )
        finally:
            stop_nodes(processes)


def print_stalls(label: str, streams: Sequence[Replayed]) -> None:
    stalls = sorted(s.stall_ms for s in streams)
    replays = sorted(f.replay_ms or 0.0 for s in streams for f in s.failovers)
    waits = sorted(f.waited_ms for s in streams for f in s.failovers)
    print(
        f"{label:>22}: stalls ms {' '.join(f'{x:.0f}' for x in stalls)}; "
        f"min {stalls[0]:.0f} max {stalls[-1]:.0f} max/min {stalls[-1] / stalls[0]:.2f}; "
        f"{len(replays)} re-routes, detection ms {waits[0]:.0f}..{waits[-1]:.0f}, "
        f"replay ms {replays[0]:.0f}..{replays[-1]:.0f}",
        flush=True,
    )


async def concurrent_main(count: int, tokens: int, rounds: int, entry_layers: str) -> None:
    runtime = RuntimeConfig(threads=1)
    context = ModelContext.open(runtime, progress=False)
    prompts = [prompt_of(context, 256) + f" ({i})" for i in range(count)]
    where = f"layers {entry_layers}" if entry_layers else "no layers"
    print(
        f"kill -9 of the hop {count} streams go through, in decode; they replay on a spare; "
        f"the entry serves {where}"
    )
    # alternated, so that a busy spell of the machine falls on both
    for _ in range(rounds):
        batched = runtime.prefill_batch_tokens
        for label, batch in (("one at a time (0)", 0), (f"batched ({batched})", batched)):
            streams = await concurrent_lab(runtime, prompts, tokens, batch, entry_layers)
            print_stalls(label, streams)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prefixes", default="32,256,1024")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--streams", type=int, default=0, help="concurrent streams (see above)")
    parser.add_argument("--rounds", type=int, default=1, help="with --streams: rounds of each")
    parser.add_argument(
        "--entry-layers", default="0:15", help='with --streams: layers the entry serves ("": none)'
    )
    args = parser.parse_args()
    if args.streams:
        await concurrent_main(args.streams, args.tokens, args.rounds, args.entry_layers)
        return
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
