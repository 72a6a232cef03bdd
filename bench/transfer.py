"""Weights moving while the swarm decodes: does a transfer starve inference?

Three node processes hold the embedded model and serve it split three ways (--span 0:10,
10:20, 20:30). This process measures greedy single-stream decode tokens/s through the first
node, then measures it again while a node without the file (here: a fetcher in this process,
speaking the same authenticated transfer protocol) pulls every layer from the three nodes
over and over. It prints decode tokens/s without and with the transfer, their ratio (the
target is at least 0.8), and the transfer's MB/s. Senders pace each peer to
transfer.rate_bytes_per_s (--rate, bytes/s; 0 = no limit).

    python -m bench.transfer [--tokens 64] [--rounds 3] [--rate 67108864]   (from the repo root)
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from harness.streams import follow
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig, TransferConfig
from swarm.demo import free_ports, start_node, stop_nodes, wait_for_coverage
from swarm.runtime.checkpoint.layout import layer_part
from swarm.runtime.checkpoint.manifest import Manifest
from swarm.runtime.checkpoint.store import ModelStore, find_fetched
from swarm.transfer.fetch import Fetcher, PeerClient
from swarm.transfer.index import fetch_index
from swarm.transfer.protocol import TransferCodec
from swarm.types import NodeId
from swarm.wire import SwarmKeys

MODEL = "smollm2-135m-instruct"
SPANS = ("0:10", "10:20", "20:30")
PROMPT = "Write a long story about a lighthouse keeper and the ships he guides."


async def decode_tokens_per_s(address: str, tokens: int) -> float:
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "temperature": 0,
    }
    return (await follow(SwarmClient(address).chat(body))).tokens_per_s()


async def keep_fetching(
    addresses: list[str], cache: Path, stop: asyncio.Event, moved: list[int]
) -> None:
    """Fetch every layer from the nodes, delete them, and again, until `stop`."""
    client = PeerClient(TransferCodec(SwarmKeys.loopback().frame, NodeId("bench")), 60.0)
    try:
        await fetch_index(client, addresses, MODEL, cache)
        folder = find_fetched(cache, MODEL)  # by name ModelStore.open would find the file
        if folder is None:
            raise RuntimeError("the model's index did not arrive")
        store = ModelStore(folder, Manifest.read(folder), source=None)
        layers = [layer_part(i) for i in range(store.num_layers)]
        while not stop.is_set():
            fetcher = Fetcher(store, client, TransferConfig())
            for part in layers:
                if stop.is_set():
                    break
                await fetcher.ensure([part], addresses)
                moved[0] += (store.folder / store.manifest.parts[part].file).stat().st_size
            for path in store.folder.glob("layer-*"):
                path.unlink()
    finally:
        await client.close()


async def run(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="swarm-transfer-"))
    runtime = RuntimeConfig(cache_dir=root / "cache")
    ports = free_ports(3)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    flags = ["--threads", "1", "--transfer-rate-bytes", str(args.rate)]
    processes = [
        start_node(
            port, None if i == 0 else addresses[0], root / "state", runtime, [*flags, "--span", s]
        )
        for i, (port, s) in enumerate(zip(ports, SPANS, strict=True))
    ]
    try:
        await wait_for_coverage(addresses[0], 3, 900.0)  # a loaded machine starts slowly
        await decode_tokens_per_s(addresses[0], 8)  # warm-up
        quiet = [await decode_tokens_per_s(addresses[0], args.tokens) for _ in range(args.rounds)]
        stop, moved = asyncio.Event(), [0]
        fetching = asyncio.create_task(keep_fetching(addresses, root / "fetched", stop, moved))
        await asyncio.sleep(2.0)  # the transfer is under way
        started, before = time.perf_counter(), moved[0]
        busy = [await decode_tokens_per_s(addresses[0], args.tokens) for _ in range(args.rounds)]
        rate = (moved[0] - before) / (time.perf_counter() - started)
        stop.set()
        await fetching
    except BaseException:
        stop_nodes(processes)
        print(f"node logs kept in {root / 'state'}")
        raise
    stop_nodes(processes)
    shutil.rmtree(root, ignore_errors=True)
    q, b = statistics.median(quiet), statistics.median(busy)
    print(f"decode, 3 nodes, no transfer:     {q:6.1f} tok/s  (median of {args.rounds})")
    print(f"decode, 3 nodes, during transfer: {b:6.1f} tok/s  ({b / q:.2f}x; target >= 0.8x)")
    print(
        f"transfer: {rate / 1e6:6.1f} MB/s from 3 peers, each paced to {args.rate / 1e6:.0f} MB/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=TransferConfig().rate_bytes_per_s)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
