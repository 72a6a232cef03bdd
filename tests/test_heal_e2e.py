"""A hole the survivors can fill: three node processes on the embedded model with memory for 16
of its 30 layers each and no --span, so some layers have a single holder. kill -9 of such a
holder, then at once a request through a survivor: the request waits while the survivors take
those layers over (up to net.coverage_wait_s) instead of being refused, and its text is what
one process makes.

The nodes run with the `lan` preset's cool-down between moves (30 s), longer than the request's
wait (10 s): the kill comes seconds after every node took its first span, so a survivor that
let its cool-down hold back the move that fills the hole would have the request refused."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.cluster import get_json, greedy_chat, start_cluster
from harness.polling import until
from harness.reference import generate_locally
from swarm.config import PlacementConfig, RuntimeConfig
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import bytes_per_layer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPT = "Write a short story about lighthouses."
TOKENS = 12


def _sole_holders(members: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Per member address, the layers no other member holds."""
    holders: Counter[int] = Counter()
    for member in members:
        if member["span"]:
            holders.update(range(*member["span"]))
    return {
        m["address"]: [layer for layer in range(*m["span"]) if holders[layer] == 1]
        for m in members
        if m["span"]
    }


def test_a_request_right_after_the_only_holder_of_layers_dies_waits_for_the_survivors(
    smol_runtime: RuntimeConfig, tmp_path: Path
) -> None:
    runtime = dataclasses.replace(smol_runtime, threads=1)
    context = ModelContext.open(runtime, progress=False)
    memory = str(16 * bytes_per_layer(context))  # 48 layers' room for 30: not two copies
    config = tmp_path / "bootstrap.toml"
    config.write_text(f"[placement]\ncooldown_s = {PlacementConfig().cooldown_s}\n")
    flags = [["--layer-memory-bytes", memory, "--threads", "1", "--config", str(config)]] * 3
    (reference,) = asyncio.run(generate_locally(runtime, [PROMPT], TOKENS))
    cluster = asyncio.run(start_cluster(runtime, tmp_path / "state", flags, 3))
    try:

        async def scenario() -> tuple[str, list[int], float]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
                status = await get_json(http, f"http://{cluster.addresses[0]}/status")
                sole = {
                    a: layers for a, layers in _sole_holders(status["members"]).items() if layers
                }
                assert sole, f"every layer has two holders: {status['members']}"
                victim, layers = next(iter(sole.items()))
                survivor = next(a for a in cluster.addresses if a != victim)
                cluster.processes[cluster.index_of(victim)].kill()
                started = time.monotonic()
                answer = await greedy_chat(http, survivor, PROMPT, TOKENS)
                waited = time.monotonic() - started
                return answer["choices"][0]["message"]["content"], layers, waited

        text, layers, waited = asyncio.run(scenario())
    finally:
        cluster.stop()
    print(
        f"\n{len(layers)} layers lost their only holder; the request was answered in {waited:.1f} s"
    )
    assert text == reference.text


def test_a_request_while_the_only_holder_of_pinned_layers_starts_again_waits_for_it(
    smol_runtime: RuntimeConfig, tmp_path: Path
) -> None:
    """Two nodes pinned to 0:15 and 15:30; the second is killed and started again. A request
    that arrives once the entry sees it alive, but before it has loaded its span again, waits
    for those layers (the span it loads is in its record from its start) instead of being
    refused: no live member serves them, yet one is about to."""
    runtime = dataclasses.replace(smol_runtime, threads=1)
    flags = [["--threads", "1", "--span", span] for span in ("0:15", "15:30")]
    (reference,) = asyncio.run(generate_locally(runtime, [PROMPT], TOKENS))
    cluster = asyncio.run(start_cluster(runtime, tmp_path / "state", flags, 2))
    entry, restarted = cluster.addresses

    async def member(http: aiohttp.ClientSession) -> dict[str, Any]:
        status = await get_json(http, f"http://{entry}/status")
        return next(m for m in status["members"] if m["address"] == restarted)

    try:

        async def scenario() -> tuple[str, dict[str, Any]]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
                cluster.processes[1].kill()
                cluster.processes[1].wait()
                await until(lambda: _state(member(http), "dead"), "the entry sees it dead", 60)
                await asyncio.to_thread(cluster.start, 1)
                await until(lambda: _state(member(http), "alive"), "it joins again", 120)
                seen = await member(http)
                answer = await greedy_chat(http, entry, PROMPT, TOKENS)
                return answer["choices"][0]["message"]["content"], seen

        text, seen = asyncio.run(scenario())
    finally:
        cluster.stop()
    assert seen["span"] is None, f"it served its span again before the request: {seen}"
    assert text == reference.text


async def _state(member: Any, state: str) -> bool:
    found: dict[str, Any] = await member
    return bool(found["state"] == state)
