"""Five hosts in network namespaces (harness/netns.py) running the tiny model, for the tests
of real network conditions: every view agreeing before they start, and what the tests ask of
the hosts (a greedy answer, each host's view of the others)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from harness.factories import write_tiny_llama
from harness.netns import API_TOKEN, AUTH, Lab
from harness.polling import until
from swarm.config import RuntimeConfig
from swarm.demo import wait_for_coverage
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import bytes_per_layer
from swarm.wire import generate_secret_file

TINY_LAYERS = 8
MINORITY_LAYERS = 3  # two of these hold 6 of the 8 layers: the minority cannot serve alone


async def node_status(address: str) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=20)
    async with (
        aiohttp.ClientSession(timeout=timeout, headers=AUTH) as http,
        http.get(f"http://{address}/status") as r,
    ):
        return await r.json()  # type: ignore[no-any-return]


async def ask(address: str, text: str, tokens: int) -> tuple[int, dict[str, Any], float]:
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
    return {m["address"]: m["state"] for m in (await node_status(address))["members"]}


async def views_of(addresses: list[str]) -> list[dict[str, str]]:
    """Each host's view: the state of every member it lists, by address."""
    return list(await asyncio.gather(*(_states(a) for a in addresses)))


async def all_see_all_alive(addresses: list[str]) -> bool:
    views = await views_of(addresses)
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
            until(lambda: all_see_all_alive(addresses), "all views agreeing", 60, every_s=0.2)
        )
        yield lab, addresses
