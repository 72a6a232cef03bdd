"""Re-plans cover before they release: real node processes with automatic placement (no
--span) and tight memory re-plan as a node joins and as it leaves, while a monitor polls
every node's /status; no node ever sees a layer uncovered, and a request sent meanwhile gets
its answer."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.cluster import start_cluster
from swarm.config import RuntimeConfig
from swarm.demo import wait_for_coverage
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import bytes_per_layer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
LAYERS = 30  # the embedded model's


async def _statuses(http: aiohttp.ClientSession, addresses: list[str]) -> list[dict[str, Any]]:
    async def one(address: str) -> dict[str, Any] | None:
        try:
            async with http.get(f"http://{address}/status") as r:
                return await r.json()  # type: ignore[no-any-return]
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None  # a node that left

    return [s for s in await asyncio.gather(*(one(a) for a in addresses)) if s is not None]


def _uncovered(status: dict[str, Any], layers: int) -> list[int]:
    """The layers no member holds in a node's view, counting suspects as holding theirs: a
    busy node (one loading its new span on a shared two-core machine) may miss an ack and be
    suspected, which takes it off routes but not its layers; requests wait for a suspect
    (route_choice's `standing`), and this test is about moves, not suspicion."""
    held = set()
    for member in status["members"]:
        if member["span"] and member["state"] in ("alive", "suspect"):
            held.update(range(*member["span"]))
    return [layer for layer in range(layers) if layer not in held]


async def _monitor(addresses: list[str], stop: asyncio.Event) -> tuple[list[str], set[str]]:
    """Every 50 ms, each node's view: the moments some node that had seen every layer covered
    saw layers missing, and every layout seen (to show that spans did move)."""
    holes: list[str] = []
    layouts: set[str] = set()
    joined: set[str] = set()  # nodes whose view was complete once: a new node starts empty
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while not stop.is_set():
            for status in await _statuses(http, addresses):
                spans = sorted((m["id"], str(m["span"])) for m in status["members"])
                layouts.add(repr(spans))
                node = status["node"]["id"]
                missing = _uncovered(status, LAYERS)
                if not missing:
                    joined.add(node)
                elif node in joined:
                    holes.append(f"{node} misses layers {missing} ({spans})")
            await asyncio.sleep(0.05)
    return holes, layouts


def test_a_replan_never_leaves_a_layer_uncovered(
    smol_runtime: RuntimeConfig, tmp_path: Path
) -> None:
    # the real model: loading a span takes long enough for a careless move to open a hole
    runtime = dataclasses.replace(smol_runtime, threads=1)
    context = ModelContext.open(runtime, progress=False)
    memory = str(16 * bytes_per_layer(context))  # of 30 layers: two nodes split, three re-plan
    flags = [["--layer-memory-bytes", memory, "--threads", "1"]] * 3
    cluster = asyncio.run(start_cluster(runtime, tmp_path / "state", flags[:2], 2))
    try:

        async def scenario() -> tuple[list[str], set[str], int]:
            stop = asyncio.Event()
            watching = asyncio.create_task(_monitor(cluster.addresses, stop))
            cluster.flags.append(flags[2])
            cluster.addresses.append(f"127.0.0.1:{_free_port()}")
            cluster.start(2)  # joins: the plan spreads 4 layers over three nodes
            await wait_for_coverage(cluster.addresses[0], 3, 120)
            await asyncio.sleep(8)  # moves follow their cool-down
            left = cluster.terminate(2)  # leaves: the two others take its layers back
            await asyncio.sleep(8)
            stop.set()
            holes, layouts = await watching
            return holes, layouts, left

        holes, layouts, left = asyncio.run(scenario())
    finally:
        cluster.stop()
    assert left == 0
    assert len(layouts) >= 3, f"the spans never moved: {layouts}"
    assert not holes, holes[:10]


def _free_port() -> int:
    from swarm.demo import free_ports

    (port,) = free_ports(1)
    return port
