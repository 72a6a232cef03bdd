"""Placement across real node processes: a node three times faster serves more layers. The
kernel makes the difference: the slow node runs under a cgroup CPU quota of a fifth of a core,
the fast one gets what the machine gives it (half a core or more, even when other work shares
it). Each measures and announces its pace like any machine would."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp
import pytest

from harness.cluster import start_cluster
from harness.cpu_quota import CpuQuota, unavailable
from harness.factories import write_tiny_llama
from harness.polling import DidNotHappen, until
from swarm.config import RuntimeConfig
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import bytes_per_layer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_node_three_times_faster_serves_more_layers(tmp_path: Path) -> None:
    """The slow node starts first and takes all the layers it can hold; once the fast one
    joins, the plan moves most layers to it (about 3:1)."""
    folder = tmp_path / "tiny24"
    write_tiny_llama(folder, num_hidden_layers=24)
    runtime = RuntimeConfig(model=str(folder), cache_dir=tmp_path / "cache")
    context = ModelContext.open(runtime, progress=False)
    memory = str(20 * bytes_per_layer(context))  # neither holds all 24 layers
    fast = ["--layer-memory-bytes", memory, "--threads", "1"]
    why = unavailable()
    if why is not None:
        pytest.skip(f"a slow machine needs a CPU quota: {why}")
    slow = CpuQuota("slow")
    slow.limit(0.2)
    try:
        cluster = asyncio.run(
            start_cluster(
                runtime,
                tmp_path / "state",
                [fast, fast],
                2,
                started=lambda i, pid: slow.add(pid) if i == 0 else None,
            )
        )
        try:
            layers = asyncio.run(_until_fast_leads(cluster.addresses[1], cluster.addresses[0]))
        finally:
            cluster.stop()
    finally:
        slow.remove()
    assert layers[cluster.addresses[1]] >= 2 * layers[cluster.addresses[0]], layers


async def _until_fast_leads(fast: str, slow: str, timeout_s: float = 90.0) -> dict[str, int]:
    """The layers each node serves once the fast one serves twice the slow one's, or when
    `timeout_s` has passed (the caller's assertion names them)."""
    layers: dict[str, int] = {}

    async def leads() -> bool:
        nonlocal layers
        status = await _status(fast)
        layers = {m["address"]: m["span"][1] - m["span"][0] for m in status["members"] if m["span"]}
        return status["coverage"]["complete"] and layers.get(fast, 0) >= 2 * layers.get(slow, 99)

    with contextlib.suppress(DidNotHappen):
        await until(leads, "the fast node leading", timeout_s, every_s=0.5)
    return layers


async def _status(address: str) -> dict:  # type: ignore[type-arg]
    async with aiohttp.ClientSession() as http, http.get(f"http://{address}/status") as r:
        return await r.json()  # type: ignore[no-any-return]
