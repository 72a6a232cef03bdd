"""Copies share the load: three node processes that each hold the embedded model, joined in
one swarm, against one node alone, both sides in one run.

    python -m bench.copies [--tokens 48] [--streams 6] [--repeats 2] [--cpus 0,1,2]

Nine processes start: three joined (the copies; placement gives each the whole model), three
joined that split the model, and three single-node swarms (nothing joins them). Node i of
each group is pinned to CPU `--cpus[i]` (sched_setaffinity right after the process starts,
before it imports torch, so its threads inherit it), one torch thread each. The rounds
alternate, `--repeats` times, since this VM's speed drifts from minute to minute:

- copies: `--streams` concurrent greedy streams into joined node 0, which keeps some and
  sends the others on to the copies (`model_routing.spread`); aggregate tokens/s.
- alone: the same streams into lone node 0; aggregate tokens/s.
- split: the same streams into the first of three more nodes whose memory holds a third of
  the model each (`--layer-memory-bytes`), joined: the model as a pipeline of three spans,
  each node on the same CPU as the copy of its index (the cost of a split against copies).
- bare: the streams shared out by the client, `--streams` / 3 to each lone node at once: the
  three processes' own speed on these CPUs with no swarm between them, the ceiling of the
  copies row.
- single: one stream into joined node 0 and one into lone node 0, each alone: tokens/s as
  the client sees them (a lone request stays at its entry, so these should agree).

It prints each round's figures and the medians' ratios: copies / alone (the aim is 2.5x
with three cores), copies / bare (what the spreading costs against the ceiling) and single
copies / single alone (the aim is within 5%). With fewer cores than nodes, `--cpus` puts
two nodes on one core and the ceiling says so.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen

from bench.heterogeneous import PROMPTS
from harness.streams import follow
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import free_ports, start_node, stop_nodes, wait_for_coverage
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import bytes_per_layer

NODES = 3


@dataclass
class Nodes:
    joined: list[str]  # the copies' addresses, node 0 first
    split: list[str]  # the split's addresses, node 0 first
    lone: list[str]  # the single-node swarms' addresses
    processes: list[Popen[bytes]]


def _start(
    address: str, join: str | None, state: Path, runtime: RuntimeConfig, cpu: int, *extra: str
) -> Popen[bytes]:
    port = int(address.rpartition(":")[2])
    process = start_node(port, join, state, runtime, ["--threads", "1", *extra])
    os.sched_setaffinity(process.pid, {cpu})
    return process


async def start(runtime: RuntimeConfig, state: Path, cpus: list[int]) -> Nodes:
    context = ModelContext.open(runtime, progress=False)
    third = str(bytes_per_layer(context) * -(-context.num_layers // NODES))
    addresses = [f"127.0.0.1:{p}" for p in free_ports(3 * NODES)]
    nodes = Nodes(addresses[:NODES], addresses[NODES : 2 * NODES], addresses[2 * NODES :], [])
    swarms = (("joined", nodes.joined, ()), ("split", nodes.split, ("--layer-memory-bytes", third)))
    try:
        for name, group, extra in swarms:
            for i, address in enumerate(group):
                join = None if i == 0 else group[0]
                process = _start(address, join, state / name, runtime, cpus[i], *extra)
                nodes.processes.append(process)
        for i, address in enumerate(nodes.lone):
            nodes.processes.append(_start(address, None, state / f"lone{i}", runtime, cpus[i]))
        await wait_for_coverage(nodes.joined[0], NODES, 600, copies=NODES)
        await wait_for_coverage(nodes.split[0], NODES, 600)
        for address in nodes.lone:
            await wait_for_coverage(address, 1, 600)
    except BaseException:
        stop_nodes(nodes.processes)
        raise
    return nodes


async def _stream(address: str, prompt: str, tokens: int) -> list[float]:
    """One greedy stream's chunk times."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens}
    timed = await follow(SwarmClient(address).chat({**body, "temperature": 0}))
    return timed.stamps


async def aggregate(addresses: list[str], tokens: int) -> float:
    """Tokens per second of one stream per address (repeats allowed), all at once."""
    started = time.perf_counter()
    stamps = await asyncio.gather(
        *(_stream(a, PROMPTS[i % len(PROMPTS)], tokens) for i, a in enumerate(addresses))
    )
    return sum(map(len, stamps)) / (max(s[-1] for s in stamps) - started)


async def single(address: str, tokens: int) -> float:
    body = {"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": tokens}
    return (await follow(SwarmClient(address).chat({**body, "temperature": 0}))).tokens_per_s()


async def rounds(nodes: Nodes, streams: int, tokens: int, repeats: int) -> dict[str, list[float]]:
    kinds = ("copies", "split", "alone", "bare", "single copies", "single alone")
    got: dict[str, list[float]] = {k: [] for k in kinds}
    share = [nodes.lone[i % NODES] for i in range(streams)]
    await aggregate([nodes.joined[0], nodes.split[0], *nodes.lone], 4)  # warm-up
    for r in range(repeats):
        got["copies"].append(await aggregate([nodes.joined[0]] * streams, tokens))
        got["split"].append(await aggregate([nodes.split[0]] * streams, tokens))
        got["alone"].append(await aggregate([nodes.lone[0]] * streams, tokens))
        got["bare"].append(await aggregate(share, tokens))
        got["single copies"].append(await single(nodes.joined[0], tokens))
        got["single alone"].append(await single(nodes.lone[0], tokens))
        print(
            f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in got.items()), flush=True
        )
    return got


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cpus", default="0,1,2", help="the CPU of node i (joined and lone)")
    args = parser.parse_args()
    cpus = [int(c) for c in args.cpus.split(",")]
    if len(cpus) != NODES:
        parser.error(f"--cpus names {NODES} CPUs, one per node, not {len(cpus)}")
    runtime = RuntimeConfig(threads=1)
    with tempfile.TemporaryDirectory() as state:
        nodes = await start(runtime, Path(state), cpus)
        try:
            got = await rounds(nodes, args.streams, args.tokens, args.repeats)
            answered = [len((await SwarmClient(a).status()).recent_requests) for a in nodes.joined]
        finally:
            stop_nodes(nodes.processes)
    m = {k: statistics.median(v) for k, v in got.items()}
    print(f"\n{args.streams} streams of {args.tokens} tokens, CPUs {args.cpus} (tokens/s, medians)")
    print(
        f"copies {m['copies']:.1f}  split {m['split']:.1f}  alone {m['alone']:.1f}  "
        f"bare {m['bare']:.1f}"
    )
    print(f"split / copies        {m['split'] / m['copies']:.2f}")
    print(f"copies / alone        {m['copies'] / m['alone']:.2f}x  (aim: >= 2.5x on 3 cores)")
    print(f"bare / alone          {m['bare'] / m['alone']:.2f}x  (the ceiling on these CPUs)")
    print(f"copies / bare         {m['copies'] / m['bare']:.2f}")
    print(f"requests each copy answered itself (entry first): {answered}")
    single_ratio = m["single copies"] / m["single alone"]
    print(
        f"single stream: copies {m['single copies']:.1f}, alone {m['single alone']:.1f}, "
        f"ratio {single_ratio:.3f} (aim: within 5%)"
    )


if __name__ == "__main__":
    asyncio.run(main())
