"""Mismatched machines: what speed-weighted placement, live re-splitting and batching buy.

A slow machine is made by the kernel: a cgroup v1 CPU quota of a third of a core around a node
process (needs root and /sys/fs/cgroup/cpu). The node measures its own pace and announces it;
nothing in it knows it is a benchmark.

1. Three node processes with speeds 1:1:3 (a quota of 1/3 core each for two of them, none for
   the third), 8 concurrent greedy streams: aggregate tokens/s with the planner's
   speed-weighted split, with a forced even split (--span 0:10, 10:20, 20:30), and the ideal
   bound: the sum of the nodes' own rates, each node alone serving the whole model to 8
   streams under its own quota. The client talks to a slow node (whose process then also
   runs the head, sampling and HTTP streams of every session), and in one more run to the
   fast one. Before each swarm is measured, it serves the same load until its spans settle
   (its paces are then loaded ones, as in a swarm in use); the spans are printed, the entry's
   first. A second bound sums the nodes' rates at one stream each, batching nowhere: a
   swarm's hops see only the streams that reach them at once, so its batches are smaller
   than one node's with all 8. For every run, each node's CPU time over the wall time (of
   its quota), its threads' run-queue wait and its quota's throttled time over the wall
   time (a stage waiting for a CPU, not for work), and the mean batches it ran are printed
   too.
2. One node, whole model: 8 concurrent streams against 1 (continuous batching at the hop).
3. A time series: three equal nodes serve streams non-stop, 30 s for the swarm to adapt to
   the load (its idle paces become loaded ones), then a steady minute; then one node is
   capped at a third of a core, then uncapped. Aggregate throughput and each node's span
   over time go to a PNG; printed are the span moves in the first 30 s and in the steady
   minute, and the time from the cap until throughput is back to 90% of the new steady
   state.

    python -m bench.heterogeneous [--tokens 64] [--png docs/resplit.png] [--no-series]
        [--runs one1,one8,slow8,slow1,weighted,fast-entry,even] [--streams 8]
    (from the repo root; needs matplotlib: pip install -e '.[bench]')
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

from harness.cpu_quota import CpuQuota, unavailable
from harness.streams import follow
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import free_ports, start_node, stop_nodes, wait_for_coverage
from swarm.placement import predicted_rate
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import bytes_per_layer

PROMPTS = [
    "Write a long story about a lighthouse keeper.",
    "Describe the life of a honey bee in detail.",
    "Explain how trains changed the world.",
    "Tell me about the moons of Jupiter.",
    "Write a poem about rivers and then explain it.",
    "Describe a busy bakery at dawn.",
    "Explain volcanoes to a curious child.",
    "Write a letter from a dragon to a knight.",
]
STREAMS = 8


@dataclass
class Swarm:
    addresses: list[str]
    processes: list[Popen[bytes]] = field(default_factory=list)
    quotas: list[CpuQuota] = field(default_factory=list)  # one group per slow node

    def stop(self) -> None:
        stop_nodes(self.processes)
        for quota in self.quotas:
            quota.remove()


SLOW = 1 / 3  # cores a slow node gets
LOADED_AT = 30.0  # seconds of load in the time series before its steady minute


async def start_swarm(
    runtime: RuntimeConfig, state: Path, flags: Sequence[list[str]], slow: Sequence[int] = ()
) -> Swarm:
    """One node per entry of `flags`; those whose index is in `slow` run each under its own
    CPU quota (a machine of its own) from their first instruction, so the speed they measure
    at start is already slow."""
    ports = free_ports(len(flags))
    swarm = Swarm([f"127.0.0.1:{p}" for p in ports])
    for i, (port, extra) in enumerate(zip(ports, flags, strict=True)):
        join = None if i == 0 else swarm.addresses[0]
        process = start_node(port, join, state, runtime, [*extra, "--threads", "1"])
        swarm.processes.append(process)
        if i in slow:
            quota = CpuQuota(f"slow-{port}")
            quota.limit(SLOW)
            quota.add(process.pid)
            swarm.quotas.append(quota)
    await wait_for_coverage(swarm.addresses[0], len(flags), 300)
    return swarm


async def stream(client: SwarmClient, prompt: str, tokens: int, stamps: list[float]) -> None:
    """One greedy stream, whose chunks' arrival times join `stamps` (shared by the streams)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens}
    timed = await follow(client.chat({**body, "temperature": 0}))
    stamps.extend(timed.stamps)


async def aggregate(address: str, streams: int, tokens: int) -> float:
    """Tokens per second over `streams` concurrent streams of `tokens` tokens each."""
    client = SwarmClient(address)
    await stream(client, PROMPTS[0], 4, [])  # warm-up
    stamps: list[float] = []
    started = time.perf_counter()
    await asyncio.gather(
        *(stream(client, PROMPTS[i % len(PROMPTS)], tokens, stamps) for i in range(streams))
    )
    return len(stamps) / (time.perf_counter() - started)


@dataclass(frozen=True)
class Run:
    """One measured configuration: its key (for --runs), name, flags per node, the nodes
    under a quota (by index) and how many streams it serves."""

    key: str
    name: str
    flags: list[list[str]]
    slow: tuple[int, ...]
    streams: int


@dataclass(frozen=True)
class NodeUse:
    """What one node did during a measured run: how busy it was and the batches it ran."""

    busy: float  # CPU time over wall time, as a share of the cores it may use
    # its threads' time ready to run and not running (the kernel's run-queue delay, its
    # quota's throttling included), over wall time: threads' worth waiting for a CPU
    ready: float
    throttled: float  # the wall time its quota held it back (0 without a quota)
    hop_batch: float  # mean steps per batched call of its decoder layers
    head_batch: float  # mean sessions per batched head call (0: it was no entry)
    fixed_ms: float  # what it announced a step costs it beyond its layers, as the run ended


async def measured(
    swarm: Swarm, slow: Sequence[int], streams: int, tokens: int
) -> tuple[float, list[NodeUse], float]:
    """`aggregate` through the first node, with what each node did meanwhile and the
    throughput placement predicted for the swarm's `streams` streams as the run ended (its
    bottleneck, or the streams' tokens per pass through its fastest route where that is
    less; tokens/s, at the paces and fixed costs the members announce then)."""
    clients = [SwarmClient(a) for a in swarm.addresses]
    before = [(await c.status()).node.load for c in clients]
    quotas = dict(zip(slow, swarm.quotas, strict=False))
    cpu_before = [_cpu_s(p.pid) for p in swarm.processes]
    ready_before = [_ready_s(p.pid) for p in swarm.processes]
    held_before = {i: _throttled_s(q) for i, q in quotas.items()}
    started = time.perf_counter()
    rate = await aggregate(swarm.addresses[0], streams, tokens)
    wall = time.perf_counter() - started
    cpu_after = [_cpu_s(p.pid) for p in swarm.processes]
    ready_after = [_ready_s(p.pid) for p in swarm.processes]
    held = {i: (_throttled_s(q) - held_before[i]) / wall for i, q in quotas.items()}
    statuses = [await c.status() for c in clients]
    after = [status.node.load for status in statuses]
    coverage = statuses[0].coverage
    predicted = predicted_rate(coverage.bottleneck_tokens_per_s, coverage.route_ms, streams)
    fixed = {m.address: m.ms_per_step_fixed for m in statuses[0].members}
    uses = []
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        cores = SLOW if i in slow else 1.0
        uses.append(
            NodeUse(
                (cpu_after[i] - cpu_before[i]) / wall / cores,
                (ready_after[i] - ready_before[i]) / wall,
                held.get(i, 0.0),
                _mean(a.hop.batched_steps - b.hop.batched_steps, a.hop.batches - b.hop.batches),
                _mean(
                    a.entry.batched_steps - b.entry.batched_steps,
                    a.entry.batches - b.entry.batches,
                ),
                fixed.get(swarm.addresses[i], 0.0),
            )
        )
    return rate, uses, predicted


def _cpu_s(pid: int) -> float:
    """CPU seconds a process (all its threads) has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ready_s(pid: int) -> float:
    """Seconds the process's threads have spent ready to run and not running, summed (the
    second field of each thread's /proc schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


def _throttled_s(quota: CpuQuota) -> float:
    """Seconds the quota's group has been throttled (cgroup v1 cpu.stat)."""
    stat = dict(line.split() for line in (quota.path / "cpu.stat").read_text().splitlines())
    return int(stat.get("throttled_time", "0")) / 1e9


def _mean(total: int, count: int) -> float:
    return total / count if count else 0.0


async def loaded(address: str, streams: int) -> dict[str, tuple[int, int]]:
    """Serve `streams` streams until the spans settle, as those of a swarm in use for a while
    have (its paces are loaded ones). The spans then."""
    client = SwarmClient(address)
    for _ in range(2):
        await asyncio.gather(
            *(stream(client, PROMPTS[i % len(PROMPTS)], 32, []) for i in range(streams))
        )
        await settled(client)
    return await spans_of(client)


async def spans_of(client: SwarmClient) -> dict[str, tuple[int, int]]:
    status = await client.status()
    return {m.address: m.span for m in status.members if m.span}


async def settled(client: SwarmClient, quiet_s: float = 15.0, limit_s: float = 120.0) -> None:
    """Wait until no span has changed for `quiet_s` (start-up re-plans as speeds are measured)."""
    last, since, start = await spans_of(client), time.monotonic(), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() - start < limit_s:
        await asyncio.sleep(0.5)
        now = await spans_of(client)
        if now != last:
            last, since = now, time.monotonic()


async def time_series(
    swarm: Swarm, tokens: int, slow_at: float, recover_at: float, end_at: float
) -> tuple[list[float], list[tuple[float, dict[str, tuple[int, int]]]]]:
    """Token arrival times and (time, spans) samples; one node capped at a third of a core
    in between."""
    client = SwarmClient(swarm.addresses[0])
    stamps: list[float] = []
    samples: list[tuple[float, dict[str, tuple[int, int]]]] = []
    start = time.perf_counter()
    stop = asyncio.Event()

    async def worker(i: int) -> None:
        while not stop.is_set():
            await stream(client, PROMPTS[i], tokens, stamps)

    async def sampler() -> None:
        while not stop.is_set():
            samples.append((time.perf_counter() - start, await spans_of(client)))
            await asyncio.sleep(0.5)

    tasks = [asyncio.create_task(worker(i)) for i in range(STREAMS)]
    tasks.append(asyncio.create_task(sampler()))
    victim = CpuQuota(f"victim-{swarm.processes[2].pid}")
    try:
        await asyncio.sleep(slow_at)
        victim.limit(SLOW)
        victim.add(swarm.processes[2].pid)
        await asyncio.sleep(recover_at - slow_at)
        victim.limit(None)
    finally:
        victim.remove()
    await asyncio.sleep(end_at - recover_at)
    stop.set()
    await asyncio.gather(*tasks)
    return [s - start for s in stamps], samples


def moves(samples: list[tuple[float, dict[str, tuple[int, int]]]], start: float, end: float) -> int:
    """Span changes seen between consecutive samples taken in [start, end)."""
    within = [spans for t, spans in samples if start <= t < end]
    return sum(a != b for a, b in itertools.pairwise(within))


def rate_per_second(stamps: list[float], end: float) -> list[float]:
    buckets = [0.0] * (int(end) + 1)
    for s in stamps:
        if s < len(buckets):
            buckets[int(s)] += 1
    return buckets


def recovery_s(rates: list[float], slow_at: float, recover_at: float) -> float | None:
    """Seconds from the cap until the 3-s average reaches 90% of the steady state (the
    mean of the last 10 s before recovery)."""
    steady = sum(rates[int(recover_at) - 10 : int(recover_at)]) / 10
    for t in range(int(slow_at) + 1, int(recover_at) - 2):
        if sum(rates[t : t + 3]) / 3 >= 0.9 * steady:
            return t + 3 - slow_at
    return None


def plot(
    path: Path,
    rates: list[float],
    samples: list[tuple[float, dict[str, tuple[int, int]]]],
    addresses: list[str],
    events: tuple[float, float],
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = 1 + len(addresses)
    fig, axes = plt.subplots(
        rows, 1, figsize=(9, 2 + 1.4 * rows), sharex=True, height_ratios=[2] + [1] * (rows - 1)
    )
    top = axes[0]
    top.plot(range(len(rates)), rates, color="black")
    top.set_ylabel("tokens/s\n(all streams)")
    capped, uncapped = events
    for x, label, style in (
        (LOADED_AT, "steady minute", {"color": "grey", "linestyle": ":"}),
        (capped, "node 3 capped to 1/3 core", {"color": "red", "linestyle": "--"}),
        (uncapped, "node 3 uncapped", {"color": "red", "linestyle": "--"}),
    ):
        for ax in axes:
            ax.axvline(x, **style)
        top.annotate(label, (x, max(rates) * 0.9), xytext=(4, 0), textcoords="offset points")
    for i, (ax, address) in enumerate(zip(axes[1:], addresses, strict=True)):
        times = [t for t, spans in samples if address in spans]
        starts = [spans[address][0] for _, spans in samples if address in spans]
        ends = [spans[address][1] for _, spans in samples if address in spans]
        ax.fill_between(times, starts, ends, step="post", color=f"C{i}", alpha=0.6)
        ax.set_ylim(0, 30)
        ax.set_ylabel(f"node {i + 1}\nlayers")
    axes[-1].set_xlabel("seconds")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def runs(streams: int, memory: list[str]) -> list[Run]:
    """Every configuration, in the order they run (runs on the same swarm in a row share it)."""
    n = f"{streams} streams"
    return [
        Run("one1", "one node, 1 stream", [[]], (), 1),
        Run("one8", f"one node, {n}", [[]], (), streams),
        Run("slow8", f"one node at 1/3 core, {n}", [[]], (0,), streams),
        Run("slow1", "one node at 1/3 core, 1 stream", [[]], (0,), 1),
        Run("weighted", "speed-weighted 1:1:3", [memory] * 3, (0, 1), streams),
        # the same swarm with the client on the fast machine: the entry also runs the head,
        # sampling and the HTTP streams of every session
        Run("fast-entry", "speed-weighted, fast entry", [memory] * 3, (1, 2), streams),
        Run(
            "even",
            "even split 1:1:3",
            [["--span", "0:10"], ["--span", "10:20"], ["--span", "20:30"]],
            (0, 1),
            streams,
        ),
    ]


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--png", type=Path, default=Path("docs/resplit.png"))
    parser.add_argument(
        "--no-series",
        dest="series",
        action="store_false",
        help="skip the time series (the cap mid-run and the steady minute)",
    )
    parser.add_argument(
        "--runs",
        default=",".join(r.key for r in runs(STREAMS, [])),
        help="which runs, by key (comma-separated); the ratios need the runs they compare",
    )
    parser.add_argument("--streams", type=int, default=STREAMS, help="concurrent streams")
    args = parser.parse_args()
    keys = {r.key for r in runs(STREAMS, [])}
    unknown = set(args.runs.split(",")) - keys
    if unknown:
        parser.error(f"unknown runs {sorted(unknown)}; known: {sorted(keys)}")
    if args.streams < 1:
        parser.error("--streams must be at least 1")
    return args


async def main() -> None:
    args = _arguments()
    why = unavailable()
    if why is not None:
        raise SystemExit(f"slow machines need a CPU quota: {why}")
    runtime = RuntimeConfig(threads=1)
    context = ModelContext.open(runtime, progress=False)
    memory = ["--layer-memory-bytes", str(20 * bytes_per_layer(context))]
    chosen = [r for r in runs(args.streams, memory) if r.key in args.runs.split(",")]
    by_key = {r.key: r.name for r in chosen}
    results: dict[str, float] = {}
    uses: dict[str, list[NodeUse]] = {}  # what each node did, in start order
    predicted: dict[str, float] = {}  # placement's bottleneck as each swarm's run ended
    layout: dict[str, list[tuple[int, int] | None]] = {}  # spans of the nodes, in start order
    with tempfile.TemporaryDirectory() as tmp:
        swarm: Swarm | None = None
        try:
            for i, run in enumerate(chosen):
                last = chosen[i - 1] if i else None
                same = last is not None and (run.flags, run.slow) == (last.flags, last.slow)
                if swarm is None or not same:
                    if swarm is not None:
                        swarm.stop()
                    swarm = await start_swarm(runtime, Path(tmp) / str(i), run.flags, run.slow)
                if len(run.flags) > 1:
                    plan = await loaded(swarm.addresses[0], run.streams)
                    layout[run.name] = [plan.get(a) for a in swarm.addresses]
                rate, used, expected = await measured(swarm, run.slow, run.streams, args.tokens)
                results[run.name], uses[run.name], predicted[run.name] = rate, used, expected
        finally:
            if swarm is not None:
                swarm.stop()
        _bounds(results, by_key)

        samples: list[tuple[float, dict[str, tuple[int, int]]]] = []
        if args.series:
            swarm = await start_swarm(runtime, Path(tmp) / "series", [memory] * 3)
            try:
                await settled(SwarmClient(swarm.addresses[0]))
                slow_at, recover_at, end_at = LOADED_AT + 60.0, LOADED_AT + 120.0, LOADED_AT + 160.0
                stamps, samples = await time_series(swarm, 32, slow_at, recover_at, end_at)
            finally:
                swarm.stop()
            rates = rate_per_second(stamps, end_at)
            plot(args.png, rates, samples, swarm.addresses, (slow_at, recover_at))

    print(f"aggregate greedy decode, {args.streams} streams x {args.tokens} tokens, 1 thread/node")
    for name, value in results.items():
        spans = layout.get(name)
        shown = "" if spans is None else "  spans " + ", ".join(_span(s) for s in spans)
        print(f"{name:32}{value:8.1f} tok/s{shown}")
    print(
        "what each node did meanwhile (start order; busy: CPU time / wall, of its quota;"
        " ready: threads' run-queue wait / wall; held: its quota's throttled time / wall):"
    )
    for name, nodes in uses.items():
        busy = " ".join(f"{u.busy:4.0%}" for u in nodes)
        ready = " ".join(f"{u.ready:4.2f}" for u in nodes)
        held = " ".join(f"{u.throttled:4.0%}" for u in nodes)
        hop = " ".join(f"{u.hop_batch:4.1f}" for u in nodes)
        head = " ".join(f"{u.head_batch:4.1f}" for u in nodes if u.head_batch)
        fixed = " ".join(f"{u.fixed_ms:4.2f}" for u in nodes)
        print(f"  {name:32}busy {busy:15} ready {ready:15} held {held:15}")
        print(f"  {'':32}hop batch {hop:15} head batch {head:9} fixed ms {fixed}")
    print(
        "placement's predicted throughput (its bottleneck, or the streams' tokens per pass"
        " through its fastest route where less, as the run ended) against measured:"
    )
    for name, expected in predicted.items():
        ratio = results[name] / expected if expected else 0.0
        print(f"  {name:32}predicted {expected:7.1f}  measured {results[name]:7.1f}  {ratio:.2f}x")
    _ratios(results, by_key)
    if not args.series:
        return
    back = recovery_s(rates, slow_at, recover_at)
    shown = "never" if back is None else f"{back:.0f} s"
    print(f"after a cap to 1/3 core, back to 90% of the new steady state in {shown} (target 30 s)")
    adapting, steady = moves(samples, 0, LOADED_AT), moves(samples, LOADED_AT, slow_at)
    print(f"span moves in the first {LOADED_AT:.0f} s of load: {adapting}")
    print(f"span moves in the steady minute before the cap: {steady} (target 0)")
    print(f"time series: {args.png}")


IDEAL = "ideal 1:1:3 (sum of own rates)"
UNBATCHED = "sum of own rates at 1 stream"


def _bounds(results: dict[str, float], by_key: dict[str, str]) -> None:
    """The ideal bounds, where the runs they sum were measured."""
    got = {key: results[name] for key, name in by_key.items()}
    if "one8" in got and "slow8" in got:
        results[IDEAL] = got["one8"] + 2 * got["slow8"]
    if "one1" in got and "slow1" in got:
        # the same sum with no batching anywhere: each node's rate at one stream
        results[UNBATCHED] = got["one1"] + 2 * got["slow1"]


def _ratios(results: dict[str, float], by_key: dict[str, str]) -> None:
    """The ratios the targets are stated in, each where the runs it compares were measured."""
    got = {key: results[name] for key, name in by_key.items()}
    weighted, fast = got.get("weighted"), got.get("fast-entry")
    if weighted is not None and "even" in got:
        print(f"speed-weighted / even split: {weighted / got['even']:.2f}x (target 1.4x)")
    for bound, label, target in (
        (IDEAL, "ideal", " (target 0.8x)"),
        (UNBATCHED, "the sum at 1 stream", ""),
    ):
        if bound not in results:
            continue
        if weighted is not None:
            print(f"speed-weighted / {label}: {weighted / results[bound]:.2f}x{target}")
        if fast is not None:
            print(f"  with the fast entry: {fast / results[bound]:.2f}x")
    if "one8" in got and "one1" in got:
        print(f"{by_key['one8']} / 1 stream: {got['one8'] / got['one1']:.2f}x (target 4x)")


def _span(span: tuple[int, int] | None) -> str:
    return "-" if span is None else f"{span[0]}:{span[1]}"


if __name__ == "__main__":
    asyncio.run(main())
