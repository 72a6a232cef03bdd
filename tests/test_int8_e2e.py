"""Three int8 node processes split the real model.

What is checked, and why this is the agreement check: int8 arithmetic is deterministic and
hidden states cross the wire losslessly, so a split must not change a single token: the
swarm's greedy text equals one int8 process's, exactly. That one-process int8 runtime follows
float32 at the agreement measured in tests/test_quant.py (teacher-forced) and bench.runtime
(50 prompts x 32 tokens); comparing free-running text with float32 instead would fail on the
first near-tie and say nothing more."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import aiohttp
import pytest

from harness.cluster import Cluster, greedy_chat, serving_cluster
from harness.reference import generate_locally
from swarm.config import RuntimeConfig
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import bytes_per_layer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPTS = ["Explain how a rainbow forms.", "Write a short poem about the sea."]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def int8_runtime(smol_runtime: RuntimeConfig) -> RuntimeConfig:
    return dataclasses.replace(smol_runtime, dtype="int8")


@pytest.fixture(scope="module")
def references(int8_runtime: RuntimeConfig) -> list[str]:
    """Computed before the nodes start, so the two do not compete for the cores."""
    return [g.text for g in asyncio.run(generate_locally(int8_runtime, PROMPTS, NEW_TOKENS))]


@pytest.fixture(scope="module")
def int8_nodes(
    int8_runtime: RuntimeConfig,
    tmp_path_factory: pytest.TempPathFactory,
    references: list[str],
) -> Iterator[Cluster]:
    per_layer = bytes_per_layer(ModelContext.open(int8_runtime, progress=False))
    memory = str(11 * per_layer)  # 30 int8 layers need all three nodes
    flags = [["--dtype", "int8", "--layer-memory-bytes", memory, "--threads", "1"]] * 3
    # the third node takes no fast links: frames to and from it go over its websockets, the
    # others' between them over fast links (a swarm of mixed settings, or a blocked port)
    no_fast = tmp_path_factory.mktemp("config") / "no-fast-links.toml"
    no_fast.write_text("[net]\nfast_links = false\n")
    flags[2] = [*flags[2], "--config", str(no_fast)]
    yield from serving_cluster(int8_runtime, tmp_path_factory, flags)


async def test_int8_nodes_split_the_model_and_match_one_int8_process(
    int8_nodes: Cluster, references: list[str]
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{int8_nodes.addresses[0]}/status") as r:
            status = await r.json()
        members = [m for m in status["members"] if m["span"]]
        assert len(members) == 3
        assert all(m["dtype"] == "int8" for m in members), members
        for prompt, reference in zip(PROMPTS, references, strict=True):
            answer = await greedy_chat(http, int8_nodes.addresses[1], prompt, NEW_TOKENS)
            assert answer["choices"][0]["message"]["content"] == reference, prompt
            assert len(answer["swarm"]["route"]) == 3
