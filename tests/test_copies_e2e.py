"""Copies share the load, over real node processes: three nodes that each hold the embedded
model serve it as three whole copies; requests that arrive at one entry together spread
over the copies, each answered with the text one process generates; a lone request stays
at its entry."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from harness.cluster import Cluster, greedy_chat, serving_cluster
from harness.polling import until
from harness.reference import generate_locally
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPT = "Name three colours of the rainbow."
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def copies(
    smol_packed: RuntimeConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    yield from serving_cluster(smol_packed, tmp_path_factory, [["--threads", "1"]] * 3)


async def _answered(address: str) -> int:
    """How many generations a node answered itself."""
    return len((await SwarmClient(address).status()).recent_requests)


async def _whole_copies(address: str) -> int:
    models = (await SwarmClient(address).status()).models
    return len(models[0].copies)


async def test_requests_at_once_spread_over_the_copies_with_one_process_text(
    copies: Cluster, smol_packed: RuntimeConfig
) -> None:
    (reference,) = await generate_locally(smol_packed, [PROMPT], NEW_TOKENS)
    entry, *others = copies.addresses
    await until(lambda: _three(entry), "the entry seeing three whole copies", 120, every_s=0.2)
    async with aiohttp.ClientSession() as http:
        answers = await asyncio.gather(
            *(greedy_chat(http, entry, PROMPT, NEW_TOKENS) for _ in range(3))
        )
    assert [a["choices"][0]["message"]["content"] for a in answers] == [reference.text] * 3
    here, elsewhere = await _answered(entry), [await _answered(a) for a in others]
    assert here >= 1 and sum(elsewhere) >= 1 and here + sum(elsewhere) == 3

    async with aiohttp.ClientSession() as http:
        alone = await greedy_chat(http, entry, PROMPT, NEW_TOKENS)
    assert alone["choices"][0]["message"]["content"] == reference.text
    assert await _answered(entry) == here + 1  # a lone request stays at its entry


async def _three(address: str) -> bool:
    return await _whole_copies(address) == 3
