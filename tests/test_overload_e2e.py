"""Three times what a swarm admits, for a short while: three node processes split the embedded
model, each entry admitting one request and queueing one (`[api]` through a config file),
and 18 greedy clients ask through all three. Every ask ends in an answer with one process's
text, a 429 with Retry-After, or a 503 that says why; once the clients are gone a lone
request is answered again within seconds (`bench.overload` runs the same for minutes)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from harness import overload
from harness.cluster import Cluster, serving_cluster
from harness.polling import until
from harness.reference import generate_locally
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.errors import RefusedError
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import bytes_per_layer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOKENS = 8
SECONDS = 10.0
CAPACITY = 2  # per entry: one slot and one place in the queue


@pytest.fixture(scope="module")
def admitting_two(
    smol_packed: RuntimeConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    config = tmp_path_factory.mktemp("config") / "bootstrap.toml"
    config.write_text("[api]\nmax_concurrent_requests = 1\nqueue_size = 1\nqueue_timeout_s = 5\n")
    context = ModelContext.open(smol_packed, progress=False)
    memory = str(11 * bytes_per_layer(context))  # 30 layers need all three nodes
    flags = [["--layer-memory-bytes", memory, "--threads", "1", "--config", str(config)]] * 3
    yield from serving_cluster(smol_packed, tmp_path_factory, flags)


@pytest.fixture(scope="module")
def references(smol_packed: RuntimeConfig) -> dict[str, str]:
    generated = asyncio.run(generate_locally(smol_packed, overload.PROMPTS, TOKENS))
    return {p: g.text for p, g in zip(overload.PROMPTS, generated, strict=True)}


async def test_three_times_capacity_gets_answers_429s_and_no_failures(
    admitting_two: Cluster, references: dict[str, str]
) -> None:
    entries = admitting_two.addresses
    clients = 3 * CAPACITY * len(entries)
    tally = await overload.drive(
        entries, clients, references, TOKENS, SECONDS, timeout_s=SECONDS + 60
    )
    assert tally.failed == [] and tally.wrong == []
    assert tally.admitted > 0, "the swarm answered while overloaded"
    assert tally.too_many > 0, "more clients than slots and places in the queue"
    assert tally.no_retry_after == [] and tally.unnamed == []

    async def answered() -> bool:
        stream = await overload.ask_once(entries[0], overload.PROMPTS[0], TOKENS, 10)
        assert stream.answer == references[overload.PROMPTS[0]]
        return True

    await until(answered, "a lone request answered after the load", 10.0, ignoring=(RefusedError,))


async def test_the_config_lowered_every_entrys_admission(admitting_two: Cluster) -> None:
    for address in admitting_two.addresses:
        api = (await SwarmClient(address).status()).api
        assert api is not None and (api.max_concurrent_requests, api.queue_size) == (1, 1)
