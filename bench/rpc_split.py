"""swarm's splits beside llama.cpp's RPC mode, and concurrent streams beside llama.cpp's own
batched decoding: the same GGUF file (the embedded model), one thread per process, both sides
in one run, alternated.

Splits: one process, then 2 and 3 processes. llama.cpp's host keeps the first layers and
hands the rest to 1 or 2 `ggml-rpc-server` processes on loopback (`llama-bench -ngl L -ts
1/1 --rpc ...`: 15 of 30 layers, or 10 and 10); swarm's nodes are capped in memory so that the
model splits into that many hops (`harness.loopback.split_swarm`), and the client asks the
node that serves the first layers, as llama.cpp's host holds them. Greedy decode tokens/s of
one stream: llama-bench's generation figure (`-p 0 -n TOKENS`, its mean over -r runs), swarm's
as the client sees it over HTTP.

Streams: 1 and 8 at once on one process. llama.cpp's `llama-batched-bench` (one sequence, then
8 in parallel, `-npp 32 -ntg TOKENS`), its generation tokens/s summed over sequences; swarm's,
one node behind HTTP, 8 chat streams at once, the tokens they carried while all of them were
decoding over that time (no prefill in either figure).

    python -m bench.rpc_split [--tokens 48] [--repeats 3] [--links fast,websocket]

With --links fast,websocket each split runs twice: swarm's nodes passing decode steps
compute thread to compute thread over fast links, and through each node's event loop over
websockets (`net.fast_links = false`), each beside its own llama.cpp runs.

llama.cpp's tools are built once by `python -m bench.llama_cpp_tools`; without them the bench
says so and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench import llama_cpp_tools
from bench.swarm import LINKS, PROMPT, swarm_rate
from harness.loopback import split_swarm
from harness.streams import concurrent_decode_rate, follow
from swarm.client import SwarmClient
from swarm.config import DEFAULT_MODEL, RuntimeConfig
from swarm.demo import free_ports
from swarm.runtime.checkpoint.source import resolve_model

LAYERS = 30  # the embedded model's
_RPC_START_S = 30.0


@contextlib.contextmanager
def rpc_servers(tools: llama_cpp_tools.Tools, count: int) -> Iterator[list[str]]:
    """`count` ggml-rpc-server processes on loopback, one thread each; their addresses."""
    ports = free_ports(count) if count else []
    processes = [
        subprocess.Popen(
            [str(tools.rpc_server), "-H", "127.0.0.1", "-p", str(port), "-t", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port in ports
    ]
    try:
        addresses = [f"127.0.0.1:{port}" for port in ports]
        for address in addresses:
            _wait_listening(address)
        yield addresses
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(10)


def _wait_listening(address: str) -> None:
    import socket

    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + _RPC_START_S
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"ggml-rpc-server did not listen on {address}") from None
            time.sleep(0.1)


def split_flags(ways: int, servers: list[str], layers: int = LAYERS) -> list[str]:
    """llama-bench's flags for a split of `layers` into `ways` processes: the host keeps the
    first layers, each server an equal share of the rest (ngl counts layers from the last)."""
    if ways == 1:
        return ["-ngl", "0"]
    offloaded = layers - layers // ways
    shares = "/".join("1" for _ in servers)
    return ["-ngl", str(offloaded), "-ts", shares, "--rpc", ",".join(servers)]


def llama_split_rate(
    tools: llama_cpp_tools.Tools, model: Path, ways: int, tokens: int, layers: int = LAYERS
) -> float:
    """llama-bench's mean generation tokens/s for one run of `tokens` on a `ways` split of a
    model of `layers` layers."""
    with rpc_servers(tools, ways - 1) as servers:
        command = [
            str(tools.bench),
            "-m",
            str(model),
            "-t",
            "1",
            "-p",
            "0",
            "-n",
            str(tokens),
            "-r",
            "1",
            "-o",
            "json",
            *split_flags(ways, servers, layers),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    rows = json.loads(done.stdout)
    return float(rows[0]["avg_ts"])


def llama_batched_rates(tools: llama_cpp_tools.Tools, model: Path, tokens: int) -> dict[int, float]:
    """Generation tokens/s summed over sequences, for 1 and 8 sequences at once."""
    command = [
        str(tools.batched_bench),
        "-m",
        str(model),
        "-t",
        "1",
        "-tb",
        "1",
        "-c",
        "4096",
        "-npp",
        "32",
        "-ntg",
        str(tokens),
        "-npl",
        "1,8",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    return parse_batched(done.stdout)


def parse_batched(table: str) -> dict[int, float]:
    """{parallel sequences (column B): S_TG t/s} from llama-batched-bench's markdown table."""
    rates: dict[int, float] = {}
    header: list[str] | None = None
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "B" in cells and "S_TG t/s" in cells:
            header = cells
        elif header is not None and len(cells) == len(header) and re.fullmatch(r"\d+", cells[0]):
            row = dict(zip(header, cells, strict=True))
            rates[int(row["B"])] = float(row["S_TG t/s"])
    if not rates:
        raise SystemExit(f"llama-batched-bench printed no table:\n{table}")
    return rates


async def swarm_streams_rate(client: SwarmClient, streams: int, tokens: int) -> float:
    """Tokens/s of `streams` greedy chat streams at once while all of them decode
    (`concurrent_decode_rate`), as llama-batched-bench's generation figure counts."""
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "temperature": 0,
    }
    done = await asyncio.gather(*(follow(client.chat(body)) for _ in range(streams)))
    return concurrent_decode_rate(done)


@dataclass(frozen=True)
class SplitRow:
    ways: int
    links: str  # how swarm's nodes pass decode steps (bench.swarm's LINKS)
    llama: float  # tok/s, median of the runs alternated with this row's swarm runs
    swarm: float


async def splits(
    tools: llama_cpp_tools.Tools,
    model: Path,
    runtime: RuntimeConfig,
    tokens: int,
    repeats: int,
    links: list[str],
) -> list[SplitRow]:
    rows = []
    for ways in (1, 2, 3):
        for how in links if ways > 1 else links[:1]:
            llama, ours = [], []
            async with split_swarm(
                runtime, ways, LINKS[how], entry_holds_layer_zero=True
            ) as client:
                await swarm_rate(client, tokens)  # warms the swarm up
                for _ in range(repeats):
                    rate = await asyncio.to_thread(llama_split_rate, tools, model, ways, tokens)
                    llama.append(rate)
                    ours.append((await swarm_rate(client, tokens))[0])
            median = statistics.median
            rows.append(SplitRow(ways, how if ways > 1 else "", median(llama), median(ours)))
    return rows


async def streams(
    tools: llama_cpp_tools.Tools, model: Path, runtime: RuntimeConfig, tokens: int, repeats: int
) -> tuple[dict[int, float], dict[int, float]]:
    llama: dict[int, list[float]] = {1: [], 8: []}
    ours: dict[int, list[float]] = {1: [], 8: []}
    async with split_swarm(runtime, 1) as client:
        await swarm_streams_rate(client, 8, tokens)  # warms it up
        for _ in range(repeats):
            theirs = await asyncio.to_thread(llama_batched_rates, tools, model, tokens)
            for n, rate in theirs.items():
                llama.setdefault(n, []).append(rate)
            for n in (1, 8):
                ours[n].append(await swarm_streams_rate(client, n, tokens))
    median = statistics.median
    return ({n: median(v) for n, v in llama.items() if v}, {n: median(v) for n, v in ours.items()})


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-splits", action="store_true")
    parser.add_argument("--skip-streams", action="store_true")
    parser.add_argument(
        "--links",
        default="fast",
        help="comma-separated: fast (decode steps compute thread to compute thread), "
        "websocket (through each node's event loop); each split runs once per kind",
    )
    args = parser.parse_args()
    links = [how.strip() for how in args.links.split(",")]
    if unknown := [how for how in links if how not in LINKS]:
        raise SystemExit(f"--links: unknown {unknown}; known: {', '.join(LINKS)}")
    tools = llama_cpp_tools.built()
    if tools is None:
        raise SystemExit("llama.cpp's tools are not built: run `python -m bench.llama_cpp_tools`")
    model = resolve_model(DEFAULT_MODEL).path
    runtime = RuntimeConfig(threads=1)
    print(f"{model.name}, one thread per process, {args.tokens} tokens, medians of {args.repeats}")
    rows = (
        []
        if args.skip_splits
        else await splits(tools, model, runtime, args.tokens, args.repeats, links)
    )
    if rows:
        print(f"{'processes':14}{'llama.cpp RPC':>15}{'swarm':>8}{'swarm/llama.cpp':>17}", end="")
        print(f"{'llama.cpp vs 1':>16}{'swarm vs 1':>12}")
    for row in rows:
        ratio = row.swarm / row.llama
        label = f"{row.ways}, {row.links}" if row.links else str(row.ways)
        print(f"{label:<14}{row.llama:15.1f}{row.swarm:8.1f}{ratio:17.2f}", end="")
        print(f"{row.llama / rows[0].llama:16.2f}{row.swarm / rows[0].swarm:12.2f}")
    if args.skip_streams:
        return
    llama, ours = await streams(tools, model, runtime, args.tokens, args.repeats)
    print(f"{'streams':10}{'llama.cpp':>15}{'swarm':>8}{'swarm/llama.cpp':>17}")
    for n in (1, 8):
        print(f"{n:<10}{llama[n]:15.1f}{ours[n]:8.1f}{ours[n] / llama[n]:17.2f}")
    print(f"8 / 1: llama.cpp {llama[8] / llama[1]:.2f}x, swarm {ours[8] / ours[1]:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
