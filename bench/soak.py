"""Churn under load: loopback node processes serving the embedded model while a schedule joins,
stops (SIGTERM), kills (-9), freezes (SIGSTOP) and slows (a cgroup CPU quota) them, one fault
every 20-40 s, and greedy streams run all along through an entry node that no fault touches
(a client whose own entry dies loses its connection; that is not what this measures).

Every node's layer memory holds about 60% of the model, so the model is split and every layer
has copies elsewhere; a down node comes back (on its port, with its state folder) at the next
event, and once in the run a node that never ran joins. Every answer is compared with one
process's greedy text.

At the end it prints: requests, faults of each kind, failed and wrong answers, the longest
stall of a stream (its longest wait for a token), the longest time a layer had no live holder
as the entry saw it, and the growth of resident memory and open file descriptors of the nodes
that lived from the end of warm-up (a quarter of the run) to the end.

    python -m bench.soak [--minutes 30] [--nodes 4] [--streams 8] [--seed 1]
    (run as a module from the repository root, as root for the CPU quota)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

import psutil

from harness import cpu_quota
from harness.reference import generate_locally
from harness.streams import TimedStream, follow
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import free_ports, start_node, stop_nodes, wait_for_coverage
from swarm.errors import LinkError, StatusFormatError, SwarmError
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import bytes_per_layer

PROMPTS = [
    "Describe the city of Paris for a first-time visitor.",
    "Write a short poem about the sea.",
    "Explain how a rainbow forms.",
    "Give three tips for keeping houseplants alive.",
    "What does a lighthouse keeper do all night?",
    "Summarize the rules of chess in a few sentences.",
]
TOKENS = 32
SHARE = 0.6  # of the model's layers each node's memory holds
KINDS = ("kill", "stop", "freeze", "slow")


@dataclass
class Node:
    port: int
    state: Path
    process: Popen[bytes] | None = None
    frozen_until: float = 0.0
    slowed_until: float = 0.0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def up(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Tally:
    requests: int = 0
    failed: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    longest_stall_ms: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    uncovered_s: float = 0.0  # the longest stretch the entry saw a layer with no holder
    samples: dict[int, list[tuple[float, int, int]]] = field(
        default_factory=dict
    )  # pid: t, rss, fds


class Lab:
    """The nodes, their faults and their samples."""

    def __init__(self, runtime: RuntimeConfig, folder: Path, count: int, rng: random.Random):
        self.runtime = runtime
        self.rng = rng
        self.folder = folder
        context = ModelContext.open(runtime, progress=False)
        layers = round(SHARE * context.num_layers)
        self.flags = [
            "--threads",
            "1",
            "--layer-memory-bytes",
            str(layers * bytes_per_layer(context)),
        ]
        ports = free_ports(count + 1)  # one more for the node that joins new
        self.nodes = [Node(p, folder / f"node{i}") for i, p in enumerate(ports[:count])]
        self.newcomer: Node | None = Node(ports[count], folder / "newcomer")
        self.can_slow = cpu_quota.unavailable() is None
        self.quotas: dict[int, cpu_quota.CpuQuota] = {}  # by port: a node's own group

    @property
    def entry(self) -> Node:
        return self.nodes[0]

    def start(self, node: Node) -> None:
        join = None if node is self.entry else self.entry.address
        node.process = start_node(node.port, join, node.state, self.runtime, self.flags)

    def processes(self) -> list[Popen[bytes]]:
        return [n.process for n in self.nodes if n.process is not None]

    def thaw_and_lift(self, now: float) -> None:
        for node in self.nodes:
            if node.frozen_until and now >= node.frozen_until and node.up:
                assert node.process is not None
                node.process.send_signal(signal.SIGCONT)
                node.frozen_until = 0.0
            if node.slowed_until and now >= node.slowed_until:
                self.quotas[node.port].limit(None)
                node.slowed_until = 0.0

    def fault(self, tally: Tally) -> str:
        """The next event: a node down comes back (or the newcomer joins), else one fault on
        a node other than the entry that is neither frozen nor slowed."""
        down = [n for n in self.nodes[1:] if not n.up]
        if down:
            node = down[0]
            self.start(node)
            tally.faults["restart"] += 1
            return f"restart {node.address}"
        if self.newcomer is not None and tally.faults["restart"] >= 2:
            node, self.newcomer = self.newcomer, None
            self.nodes.append(node)
            self.start(node)
            tally.faults["join"] += 1
            return f"join {node.address} (new)"
        calm = [n for n in self.nodes[1:] if not n.frozen_until and not n.slowed_until]
        if not calm:
            return "nothing (every node is frozen or slowed)"
        node = self.rng.choice(calm)
        kinds = [k for k in KINDS if k != "slow" or self.can_slow]
        kind = self.rng.choice(kinds)
        process = node.process
        assert process is not None
        now = time.monotonic()
        if kind == "kill":
            process.kill()
            process.wait()
        elif kind == "stop":
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(Exception):
                process.wait(timeout=30)
            if process.poll() is None:
                process.kill()
                process.wait()
        elif kind == "freeze":
            process.send_signal(signal.SIGSTOP)
            node.frozen_until = now + self.rng.uniform(5, 60)
        else:
            quota = self.quotas.setdefault(node.port, cpu_quota.CpuQuota(f"soak-{node.port}"))
            quota.add(process.pid)
            quota.limit(0.3)
            node.slowed_until = now + self.rng.uniform(20, 40)
        tally.faults[kind] += 1
        return f"{kind} {node.address}"

    def sample(self, tally: Tally) -> None:
        now = time.monotonic()
        for node in self.nodes:
            if not node.up or node.frozen_until:
                continue
            assert node.process is not None
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(node.process.pid)
                row = (now, p.memory_info().rss, p.num_fds())
                tally.samples.setdefault(node.process.pid, []).append(row)

    def close(self) -> None:
        for node in self.nodes:
            if node.frozen_until and node.up:
                assert node.process is not None
                node.process.send_signal(signal.SIGCONT)
        stop_nodes(self.processes())
        for quota in self.quotas.values():
            quota.remove()


async def stream_loop(
    lab: Lab, worker: int, references: dict[str, str], until: float, tally: Tally
) -> None:
    client = SwarmClient(lab.entry.address, timeout_s=300)
    turn = worker
    while time.monotonic() < until:
        prompt = PROMPTS[turn % len(PROMPTS)]
        turn += 1
        body = {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": TOKENS,
            "temperature": 0,
        }
        stream = TimedStream()
        tally.requests += 1
        try:
            await follow(client.chat(body), into=stream)
        except (TimeoutError, SwarmError, OSError) as e:
            tally.failed.append(f"{prompt[:30]!r}: {e}")
            await asyncio.sleep(1.0)
            continue
        tally.longest_stall_ms = max(tally.longest_stall_ms, stream.longest_wait_ms(0.0))
        if stream.answer != references[prompt]:
            tally.wrong.append(f"{prompt[:30]!r}: {stream.answer!r}")


async def coverage_loop(lab: Lab, until: float, tally: Tally) -> None:
    client = SwarmClient(lab.entry.address, timeout_s=10)
    gap_since: float | None = None
    while time.monotonic() < until:
        now = time.monotonic()
        with contextlib.suppress(LinkError, StatusFormatError, OSError, TimeoutError):
            complete = (await client.status()).coverage.complete
            if complete:
                gap_since = None
            else:
                gap_since = now if gap_since is None else gap_since
                tally.uncovered_s = max(tally.uncovered_s, now - gap_since)
        lab.sample(tally)
        await asyncio.sleep(1.0)


async def fault_loop(lab: Lab, start: float, until: float, tally: Tally) -> None:
    next_at = time.monotonic() + lab.rng.uniform(20, 40)
    while time.monotonic() < until:
        now = time.monotonic()
        lab.thaw_and_lift(now)
        if now >= next_at:
            what = await asyncio.to_thread(lab.fault, tally)
            print(f"{now - start:7.1f} s  {what}", flush=True)
            next_at = now + lab.rng.uniform(20, 40)
        await asyncio.sleep(0.5)
    lab.thaw_and_lift(float("inf"))


def growth(tally: Tally, warm_from: float) -> dict[str, float]:
    """Resident memory and descriptors at the end over those at the end of warm-up, the worst
    of the node processes that ran before warm-up ended and still ran at the end (one started
    again later is a new process, measured from its own start: not compared)."""
    rss, fds = [1.0], [1.0]
    end = max((rows[-1][0] for rows in tally.samples.values()), default=0.0)
    for rows in tally.samples.values():
        warm = next((r for r in rows if r[0] >= warm_from), None)
        lived = rows[0][0] < warm_from and rows[-1][0] >= end - 5
        if warm is None or not lived or warm is rows[-1]:
            continue
        rss.append(rows[-1][1] / warm[1])
        fds.append(rows[-1][2] / warm[2])
    return {"rss": max(rss), "fds": max(fds), "nodes": len(rss) - 1}


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    runtime = RuntimeConfig(threads=1)
    generated = await generate_locally(runtime, PROMPTS, TOKENS)
    references = {p: g.text for p, g in zip(PROMPTS, generated, strict=True)}
    tally = Tally()
    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab(runtime, Path(tmp), args.nodes, random.Random(args.seed))
        try:
            for node in lab.nodes:
                lab.start(node)
            await wait_for_coverage(lab.entry.address, args.nodes, 300)
            start = time.monotonic()
            until = start + args.minutes * 60
            print(f"{args.nodes} nodes serving; {args.streams} streams for {args.minutes} min")
            await asyncio.gather(
                fault_loop(lab, start, until, tally),
                coverage_loop(lab, until, tally),
                *(stream_loop(lab, w, references, until, tally) for w in range(args.streams)),
            )
            lab.sample(tally)
        finally:
            lab.close()
    grew = growth(tally, start + args.minutes * 60 / 4)
    summary = {
        "minutes": args.minutes,
        "requests": tally.requests,
        "faults": dict(tally.faults),
        "failed": len(tally.failed),
        "wrong": len(tally.wrong),
        "longest_stall_s": round(tally.longest_stall_ms / 1000, 1),
        "longest_uncovered_s": round(tally.uncovered_s, 1),
        "rss_growth": round(grew["rss"], 3),
        "fd_growth": round(grew["fds"], 3),
        "nodes_compared": grew["nodes"],
    }
    for line in tally.failed[:10]:
        print(f"failed: {line}")
    for line in tally.wrong[:10]:
        print(f"wrong: {line}")
    print(json.dumps(summary))


if __name__ == "__main__":
    asyncio.run(main())
