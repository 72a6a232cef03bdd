"""The swarm on real separate hosts: one node per network namespace on a bridge (harness/netns.py),
under 10% packet loss and a 3-versus-2 partition (tests/test_readme_recipe.py runs the real
model over links capped at 100 Mbit/s).

Nodes run the `lan` preset, as on a home network, with one change: a full sync every
`FULL_SYNC_S` seconds instead of 30, which bounds how long a healed partition takes to be seen.
Skipped, with the reason, where namespaces cannot be made (not root, no ip/tc/nft)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.factories import write_tiny_llama
from harness.netns import API_TOKEN, AUTH, Lab, unavailable
from harness.polling import until
from swarm.config import RuntimeConfig
from swarm.demo import wait_for_coverage
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import bytes_per_layer
from swarm.wire import generate_secret_file

UNAVAILABLE = unavailable()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(UNAVAILABLE is not None, reason=f"network namespaces: {UNAVAILABLE}"),
]

FULL_SYNC_S = 5.0
TIMINGS = {"SWARM_MEMBERSHIP_PUSH_PULL_INTERVAL_S": str(FULL_SYNC_S)}
TINY_LAYERS = 8
MINORITY_LAYERS = 3  # two of these hold 6 of the 8 layers: the minority cannot serve alone


async def _get(address: str, path: str = "/status") -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=20)
    async with (
        aiohttp.ClientSession(timeout=timeout, headers=AUTH) as http,
        http.get(f"http://{address}{path}") as r,
    ):
        return await r.json()  # type: ignore[no-any-return]


async def _ask(address: str, text: str, tokens: int) -> tuple[int, dict[str, Any], float]:
    """(HTTP status, JSON body, seconds) of a greedy chat completion."""
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": tokens, "temperature": 0}
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=180)
    async with (
        aiohttp.ClientSession(timeout=timeout, headers=AUTH) as http,
        http.post(f"http://{address}/v1/chat/completions", json=body) as r,
    ):
        return r.status, await r.json(), time.monotonic() - started


async def _states(address: str) -> dict[str, str]:
    return {m["address"]: m["state"] for m in (await _get(address))["members"]}


async def _views(addresses: list[str]) -> list[dict[str, str]]:
    return list(await asyncio.gather(*(_states(a) for a in addresses)))


async def _all_see_all_alive(addresses: list[str]) -> bool:
    views = await _views(addresses)
    return all(set(v) == set(addresses) and set(v.values()) == {"alive"} for v in views)


@contextlib.contextmanager
def five_hosts(root: Path, timings: dict[str, str]) -> Iterator[tuple[Lab, list[str]]]:
    """Five hosts: 0-2 can hold the whole tiny model, 3-4 only 3 of its 8 layers each (so
    the minority cannot serve alone); every view agrees before it yields."""
    write_tiny_llama(root / "model", num_hidden_layers=TINY_LAYERS)
    runtime = RuntimeConfig(model=str(root / "model"), cache_dir=root / "cache")
    context = ModelContext.open(runtime, progress=False)  # convert once, before the nodes start
    small = str(MINORITY_LAYERS * bytes_per_layer(context))
    secret = generate_secret_file(root / "swarm.key")
    with Lab(5) as lab:
        addresses: list[str] = []
        for i in range(5):
            flags = ["--threads", "1"] + (["--layer-memory-bytes", small] if i >= 3 else [])
            join = addresses[0] if addresses else None
            addresses.append(
                lab.start_node(i, runtime, root / "state", secret, flags, join, timings)
            )
            if i == 0:  # the big nodes take the whole model before the small ones join
                asyncio.run(wait_for_coverage(addresses[0], 1, 120, API_TOKEN))
        asyncio.run(wait_for_coverage(addresses[0], 5, 120, API_TOKEN))
        asyncio.run(
            until(lambda: _all_see_all_alive(addresses), "all views agreeing", 60, every_s=0.2)
        )
        yield lab, addresses


@pytest.fixture(scope="module")
def tiny_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, list[str]]]:
    with five_hosts(tmp_path_factory.mktemp("netns-tiny"), TIMINGS) as lab:
        yield lab


async def test_ten_percent_loss_for_half_a_minute_kills_no_node_and_loses_no_request(
    tiny_lab: tuple[Lab, list[str]],
) -> None:
    lab, addresses = tiny_lab
    lab.lose(10)
    try:
        seen: set[str] = set()
        answered = 0
        deadline = time.monotonic() + 30  # many suspicion timeouts (each a few seconds)
        rng = random.Random(0)
        while time.monotonic() < deadline:
            entry = addresses[rng.randrange(len(addresses))]
            status, body, _ = await _ask(entry, f"w{rng.randrange(200)} w5 w9", 8)
            assert status == 200, body
            assert body["usage"]["completion_tokens"] > 0
            answered += 1
            for view in await _views(addresses):
                seen |= set(view.values())
    finally:
        lab.heal()
    assert "dead" not in seen, seen
    assert answered >= 5


async def test_a_partition_fails_fast_where_layers_are_missing_and_heals(
    tiny_lab: tuple[Lab, list[str]],
) -> None:
    lab, addresses = tiny_lab
    majority, minority = addresses[:3], addresses[3:]
    cut_at = time.monotonic()
    lab.cut([0, 1, 2], [3, 4])
    try:

        async def sides_see_each_other_dead() -> bool:
            views = dict(zip(addresses, await _views(addresses), strict=True))
            return all(
                views[a].get(b) == "dead"
                for side, other in ((majority, minority), (minority, majority))
                for a in side
                for b in other
            )

        await until(
            sides_see_each_other_dead, "each side declaring the other dead", 25, every_s=0.2
        )
        for entry in minority:
            status, body, took = await _ask(entry, "w1 w2", 4)
            assert status == 503, body
            assert "no live peer serves layers" in body["error"]["message"], body
            assert took < 2.0
        served = 0
        while time.monotonic() - cut_at < 30:
            status, body, _ = await _ask(majority[served % 3], "w3 w4", 4)
            assert status == 200, body
            served += 1
    finally:
        lab.heal()
    started = time.monotonic()
    await until(
        lambda: _all_see_all_alive(addresses), "views agreeing after healing", 60, every_s=0.2
    )
    took = time.monotonic() - started
    assert took <= FULL_SYNC_S + 2.0, took
    status, body, _ = await _ask(minority[0], "w1 w2", 4)
    assert status == 200, body
