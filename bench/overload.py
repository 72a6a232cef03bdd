"""Overload: three loopback nodes split the embedded model, and three times as many greedy
clients as the swarm admits ask through all three entries for `--seconds`.

1. Capacity: a burst of twice the configured admission (`api.max_concurrent_requests` plus
   `api.queue_size`) at every entry at once; what each entry holds (in flight and queued,
   from /status) while the rest get 429 is its capacity. The burst is then dropped, and the
   entries must let go of every slot.
2. A lone request's latency at rest, the median of five.
3. The load: 3x capacity clients, spread over the entries, each asking again after its
   answer, or after the Retry-After of a refusal. Every admitted answer is checked against
   one process's greedy text. Each node's resident memory and open descriptors are sampled
   every 2 s, and its KV cache use from /status.
4. When the load stops, every client goes away at once (answers in flight are cut); a lone
   request then asks again and again until its latency is within 1.2x the one at rest.

Budgets: a node's memory may grow by its KV budget (/status `kv_budget_bytes`) and
`--request-allowance-mib` over its resident memory at rest (after a warm-up); its open
descriptors may reach the soft limit the node set for them (RLIMIT_NOFILE).

    python -m bench.overload [--seconds 300] [--load 3] [--tokens 32]
        [--max-concurrent 8 --queue 16 --queue-timeout 30]   (the API's defaults)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from harness import overload
from harness.cluster import Cluster, start_cluster
from harness.paths import MODEL_CACHE
from harness.reference import generate_locally
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.errors import LinkError, RefusedError, StatusFormatError, SwarmError
from swarm.exits import quiet_triton_teardown
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import bytes_per_layer

NODES = 3
RECOVERY_FACTOR = 1.2  # a lone request is back to normal within this much of its latency at rest
SAMPLE_EVERY_S = 2.0
MIB = 1024 * 1024


@dataclass
class Samples:
    """Per node (by address): resident bytes, open descriptors and KV bytes, as sampled."""

    rss: dict[str, list[int]] = field(default_factory=dict)
    fds: dict[str, list[int]] = field(default_factory=dict)
    kv: dict[str, list[int]] = field(default_factory=dict)
    kv_budget: dict[str, int] = field(default_factory=dict)  # at rest (the first sample)
    kv_budget_peak: dict[str, int] = field(default_factory=dict)  # two shards while moving

    async def take(self, cluster: Cluster) -> None:
        for address, process in zip(cluster.addresses, cluster.processes, strict=True):
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(process.pid)
                self.rss.setdefault(address, []).append(p.memory_info().rss)
                self.fds.setdefault(address, []).append(p.num_fds())
            with contextlib.suppress(LinkError, StatusFormatError, TimeoutError):
                async with asyncio.timeout(SAMPLE_EVERY_S):
                    hop = (await SwarmClient(address).status()).node.load.hop
                self.kv.setdefault(address, []).append(hop.kv_used_bytes)
                self.kv_budget.setdefault(address, hop.kv_budget_bytes)
                peak = max(self.kv_budget_peak.get(address, 0), hop.kv_budget_bytes)
                self.kv_budget_peak[address] = peak


async def sample_until(cluster: Cluster, samples: Samples, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await samples.take(cluster)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)


def fd_budget(pid: int) -> int:
    soft: int = psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE)[0]
    return soft


async def admission(address: str) -> tuple[int, int, int]:
    """The entry's configured admission: slots, queue, and how many it holds now."""
    api = (await SwarmClient(address).status()).api
    if api is None:
        raise SwarmError(f"{address} reports no API admission in its status")
    return api.max_concurrent_requests + api.queue_size, api.in_flight, api.queued


async def measure_capacity(entries: list[str], tokens: int) -> tuple[dict[str, int], float]:
    """What each entry holds of a burst of twice its admission, and the seconds the entries
    took to free every slot once the burst's clients went away."""
    configured = {a: (await admission(a))[0] for a in entries}
    refused = dict.fromkeys(entries, 0)

    async def one(address: str) -> None:
        try:
            await overload.ask_once(address, overload.PROMPTS[0], tokens * 4, 600)
        except RefusedError as e:
            if e.status != 429:
                raise
            refused[address] += 1

    held: dict[str, int] = {}
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(a)) for a in entries for _ in range(2 * configured[a])]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(held) < len(entries):
            await asyncio.sleep(0.5)
            for a in entries:
                _, in_flight, queued = await admission(a)
                if in_flight + queued + refused[a] == 2 * configured[a]:
                    held[a] = in_flight + queued
        for task in tasks:
            task.cancel()
    dropped = time.monotonic()
    while [(await admission(a))[1:] for a in entries] != [(0, 0)] * len(entries):
        if time.monotonic() > dropped + 120:
            raise SwarmError("the entries still held slots 120 s after the burst went away")
        await asyncio.sleep(0.2)
    return held, time.monotonic() - dropped


async def lone(address: str, tokens: int) -> tuple[float, str]:
    """A lone request's latency, and its route: each hop's port and layers."""
    stream = await overload.ask_once(address, overload.PROMPTS[0], tokens, 120)
    hops = stream.trace.route if stream.trace is not None else ()
    route = " ".join(f"{h.address.rpartition(':')[2]}[{h.layers[0]}:{h.layers[1]}]" for h in hops)
    return time.perf_counter() - stream.started, route


async def busy(entries: list[str]) -> str:
    """The generations every entry holds (slots and queue) and the sessions every node's
    layers hold, all nodes together."""
    statuses = [await SwarmClient(a).status() for a in entries]
    held = sum(s.api.in_flight + s.api.queued for s in statuses if s.api is not None)
    sessions = sum(s.node.load.hop.kv_sessions for s in statuses)
    return f"{held} held, {sessions} hop sessions"


async def recovery(
    entries: list[str], tokens: int, normal_s: float, limit_s: float
) -> tuple[float, list[str]]:
    """Seconds from now until a lone request's answer ends within RECOVERY_FACTOR of
    `normal_s` (inf past `limit_s`), and what each try met (`busy`) and got (the latency
    or the refusal), each at its seconds since now. The lone requests ask the first entry."""
    stopped = time.monotonic()
    tries: list[str] = []
    while (at := time.monotonic() - stopped) < limit_s:
        held = await busy(entries)
        at = time.monotonic() - stopped
        tries.append(f"{at:.1f}: {held}")
        try:
            latency, route = await lone(entries[0], tokens)
        except RefusedError as e:
            tries.append(f"{at:.1f}: {e.status}")
            await asyncio.sleep(0.2)  # the slots are not free yet
            continue
        tries.append(f"{at:.1f}: {latency:.2f} s via {route}")
        if latency <= RECOVERY_FACTOR * normal_s:
            return time.monotonic() - stopped, tries
    return float("inf"), tries


def config_file(folder: Path, args: argparse.Namespace) -> Path:
    path = folder / "bootstrap.toml"
    path.write_text(
        "[api]\n"
        f"max_concurrent_requests = {args.max_concurrent}\n"
        f"queue_size = {args.queue}\n"
        f"queue_timeout_s = {args.queue_timeout}\n"
    )
    return path


async def start(runtime: RuntimeConfig, folder: Path, args: argparse.Namespace) -> Cluster:
    """Three fresh node processes (not forked: each its own memory), the model split three
    ways (room for 11 of its 30 layers each)."""
    context = await asyncio.to_thread(ModelContext.open, runtime, progress=False)
    memory = str((-(-context.num_layers // NODES) + 1) * bytes_per_layer(context))
    config = str(config_file(folder, args))
    flags = [["--layer-memory-bytes", memory, "--threads", "1", "--config", config]] * NODES
    return await start_cluster(runtime, folder / "state", flags, NODES, forked=False)


async def run(args: argparse.Namespace) -> Findings:
    runtime = RuntimeConfig(cache_dir=MODEL_CACHE, threads=1)
    generated = await generate_locally(runtime, overload.PROMPTS, args.tokens)
    references = {p: g.text for p, g in zip(overload.PROMPTS, generated, strict=True)}
    with tempfile.TemporaryDirectory(prefix="swarm-overload-") as tmp:
        cluster = await start(runtime, Path(tmp), args)
        try:
            return await measure(cluster, references, args)
        finally:
            cluster.stop()


@dataclass
class Findings:
    """What one run measured, for its summary."""

    held: dict[str, int]  # each entry's capacity
    drained_s: float  # the entries freeing every slot after the capacity burst went away
    normal_s: float  # a lone request's latency at rest
    normal_route: str
    clients: int
    tally: overload.Tally
    samples: Samples
    rest_rss: dict[str, int]  # each node's resident bytes at rest
    rest_fds: dict[str, int]
    fd_budget: dict[str, int]
    recovered_s: float
    tries: list[str]  # the lone requests after the load: when (s after it) and what they got
    load_average: tuple[float, float]  # 1-minute load average before and at the end of the load


async def measure(
    cluster: Cluster, references: dict[str, str], args: argparse.Namespace
) -> Findings:
    entries = cluster.addresses
    for address in entries:  # warm-up: every entry's first request compiles and routes
        await lone(address, args.tokens)
    samples = Samples()
    await samples.take(cluster)
    held, drained_s = await measure_capacity(entries, args.tokens)
    normal = [await lone(entries[0], args.tokens) for _ in range(5)]
    normal_s = statistics.median(latency for latency, _ in normal)
    clients = round(args.load * sum(held.values()))
    print(f"capacity {held}; {clients} clients for {args.seconds:g} s", flush=True)
    before = os.getloadavg()[0]
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        sampler = group.create_task(sample_until(cluster, samples, stop))
        tally = await overload.drive(
            entries, clients, references, args.tokens, args.seconds, timeout_s=600
        )
        during = os.getloadavg()[0]
        recovered_s, tries = await recovery(entries, args.tokens, normal_s, 120)
        stop.set()
        await sampler
    await samples.take(cluster)
    return Findings(
        held=held,
        drained_s=drained_s,
        normal_s=normal_s,
        normal_route=normal[-1][1],
        clients=clients,
        tally=tally,
        samples=samples,
        rest_rss={a: rows[0] for a, rows in samples.rss.items()},
        rest_fds={a: rows[0] for a, rows in samples.fds.items()},
        fd_budget={a: fd_budget(p.pid) for a, p in zip(entries, cluster.processes, strict=True)},
        recovered_s=recovered_s,
        tries=tries,
        load_average=(before, during),
    )


def verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def node_lines(f: Findings, args: argparse.Namespace, lines: list[str]) -> tuple[bool, bool]:
    """A line per node added to `lines`; whether every node kept its memory and its
    descriptors within their budgets."""
    memory_ok = fds_ok = True
    for address, rows in f.samples.rss.items():
        kv_budget = f.samples.kv_budget.get(address, 0)
        budget = f.rest_rss[address] + kv_budget + args.request_allowance_mib * MIB
        fds = f.samples.fds[address]
        memory_ok &= max(rows) <= budget
        fds_ok &= max(fds) <= f.fd_budget[address]
        kv_peak = max(f.samples.kv.get(address, [0]))
        lines.append(
            f"  {address}: RSS {f.rest_rss[address] / MIB:.0f} MiB at rest, peak "
            f"{max(rows) / MIB:.0f}, after {rows[-1] / MIB:.0f} (budget {budget / MIB:.0f}); "
            f"KV peak {kv_peak / MIB:.1f} of {kv_budget / MIB:.0f} MiB (budget peak "
            f"{f.samples.kv_budget_peak.get(address, 0) / MIB:.0f}); fds "
            f"{f.rest_fds[address]} at rest, peak {max(fds)}, after {fds[-1]} "
            f"(budget {f.fd_budget[address]})"
        )
    return memory_ok, fds_ok


def render(f: Findings, args: argparse.Namespace) -> str:
    t = f.tally
    p = t.percentiles()
    lines = [
        f"overload: {NODES} nodes, {f.clients} clients ({args.load:g}x capacity "
        f"{sum(f.held.values())}: {' '.join(str(n) for n in f.held.values())} per entry) "
        f"for {args.seconds:g} s, {args.tokens} tokens each; load average "
        f"{f.load_average[0]:.1f} before, {f.load_average[1]:.1f} at the end",
        f"  asks: {t.admitted} admitted, {t.too_many} x 429, {t.unavailable} x 503, "
        f"{len(t.failed)} failed, {t.cut} cut at the end",
        f"  429 because: {dict(t.why_429)}",
        f"  Retry-After asked (s: times): {dict(sorted(t.retry_after_s.items()))}",
        f"  latency of admitted: p50 {p['latency_p50_s']} s, p95 {p['latency_p95_s']} s, "
        f"max {p['latency_max_s']} s; first token p50 {p['first_token_p50_s']} s, "
        f"p95 {p['first_token_p95_s']} s, max {p['first_token_max_s']} s",
        f"  lone request at rest {f.normal_s:.2f} s via {f.normal_route}; slots free "
        f"{f.drained_s:.1f} s after the capacity burst went away",
    ]
    memory_ok, fds_ok = node_lines(f, args, lines)
    lines.append(
        f"  after the load: {'; '.join(f.tries[:16])}{' ...' if len(f.tries) > 16 else ''}"
    )
    for name, values in (
        ("failed", t.failed),
        ("wrong", t.wrong),
        ("no Retry-After", t.no_retry_after),
        ("503 without a cause", t.unnamed),
    ):
        lines += [f"  {name}: {v}" for v in values[:5]]
    lines += [f"  503 cause x{n}: {cause}" for cause, n in t.causes.most_common(3)]
    bound = args.queue_timeout + args.latency_allowance
    checks = [
        ("other failures 0", not t.failed),
        ("wrong texts 0", not t.wrong),
        ("every refusal has Retry-After", not t.no_retry_after),
        ("every 503 names its cause", not t.unnamed),
        (f"admitted latency max <= {bound:g} s", p["latency_max_s"] <= bound),
        ("RSS within budget on every node", memory_ok),
        ("fds within budget on every node", fds_ok),
        (
            f"back to {RECOVERY_FACTOR}x lone latency within {args.recovery_target:g} s "
            f"(took {f.recovered_s:.1f} s)",
            f.recovered_s <= args.recovery_target,
        ),
    ]
    lines += [f"{verdict(ok)}  {name}" for name, ok in checks]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--load", type=float, default=3.0, help="clients per admitted request")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--max-concurrent", type=int, default=8)
    parser.add_argument("--queue", type=int, default=16)
    parser.add_argument("--queue-timeout", type=float, default=30.0)
    parser.add_argument(
        "--latency-allowance",
        type=float,
        default=30.0,
        help="seconds an admitted answer may take past the queue's wait",
    )
    parser.add_argument("--request-allowance-mib", type=int, default=128)
    parser.add_argument("--recovery-target", type=float, default=10.0)
    args = parser.parse_args()
    findings = asyncio.run(run(args))
    print(render(findings, args), flush=True)
    quiet_triton_teardown()


if __name__ == "__main__":
    main()
