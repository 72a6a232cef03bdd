"""No request lost: a hop killed in the middle of a generation is routed around, the session
replayed on the new route, and the text is what one process produces."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from swarm.config import RuntimeConfig
from swarm.runtime.model import ModelContext
from swarm.telemetry import bytes_per_layer
from tests.cluster import Cluster, start_cluster
from tests.reference import generate_locally

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPT = "Tell me a story about a dragon who learns to cook."
TOKENS = 48


@pytest.fixture
def four_nodes(smol_runtime: RuntimeConfig, tmp_path: Path) -> Iterator[Cluster]:
    context = ModelContext.open(smol_runtime, progress=False)
    memory = str(16 * bytes_per_layer(context))  # two stages of two replicas: two servers per layer
    flags = [["--layer-memory-bytes", memory, "--threads", "1"]] * 4
    cluster = asyncio.run(start_cluster(smol_runtime, tmp_path / "state", flags, expect_serving=4))
    try:
        yield cluster
    finally:
        cluster.stop()


async def _get(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as r:
        return await r.json()


async def test_a_hop_killed_mid_generation_is_routed_around(
    four_nodes: Cluster, smol_runtime: RuntimeConfig
) -> None:
    (reference,) = await generate_locally(smol_runtime, [PROMPT], TOKENS)
    expected = reference.text
    entry = four_nodes.addresses[0]
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": TOKENS,
        "temperature": 0,
        "stream": True,
    }
    text, chunks, killed = [], 0, None
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        status = await _get(http, f"http://{entry}/status")
        me = status["node"]["id"]
        addresses = {m["id"]: m["address"] for m in status["members"]}
        async with http.post(f"http://{entry}/v1/chat/completions", json=body) as r:
            assert r.status == 200
            async for line in r.content:
                payload = line.decode().strip()
                if not payload.startswith("data: {"):
                    continue
                chunk = json.loads(payload[len("data: ") :])
                for choice in chunk["choices"]:
                    text.append(choice["delta"].get("content", ""))
                chunks += 1
                if chunks == 6 and killed is None:
                    sessions = (await _get(http, f"http://{entry}/status"))["sessions"]
                    route = sessions[0]["route"]
                    victim = next(node for node in route if node != me)
                    killed = addresses[victim]
                    four_nodes.processes[four_nodes.addresses.index(killed)].kill()
    assert killed is not None
    assert "".join(text) == expected
