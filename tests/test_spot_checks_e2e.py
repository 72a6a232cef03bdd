"""A node that computes wrong text is caught: 4 node processes on the embedded model (packed,
on swarm's kernels), the entry serving layers 0:15 and three nodes 15:30, one of which has
one byte of layer 20 flipped in memory (runtime.test_flip_byte, tests only), which changes
the greedy text of these prompts. The entry checks every step (net.spot_check_every = 1),
so N = 1: the first step whose bits the fault changes, on a stream's route or on a shadow
run through the bad node, convicts it before its token reaches a client (a flipped weight
whose input rounds to zero changes nothing, and such steps pass, rightly). Three concurrent
greedy streams (the entry spreads them over the three holders) must each be what one
process makes; the entry names the node in /status and /metrics and leaves it out of the
routes of later requests."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import aiohttp
import pytest

from harness.cluster import Cluster, get_json, serving_cluster
from harness.reference import Generated, generate_locally
from harness.replays import SHORT_PROMPTS, Replayed, check
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FLIP = "20:200000"  # a byte of layer 20's down projection: fluent text, but not the model's
PROMPTS = SHORT_PROMPTS[:3]
TOKENS = 24
BAD = 1  # the node with the flipped byte


@pytest.fixture(scope="module")
def references(smol_packed: RuntimeConfig) -> list[Generated]:
    one_thread = dataclasses.replace(smol_packed, threads=1)
    return asyncio.run(generate_locally(one_thread, PROMPTS, TOKENS))


@pytest.fixture(scope="module")
def flipped(smol_packed: RuntimeConfig) -> list[Generated]:
    """What one process with the flipped byte makes: the fault the swarm has to catch."""
    bad = dataclasses.replace(smol_packed, threads=1, test_flip_byte=FLIP)
    return asyncio.run(generate_locally(bad, PROMPTS, TOKENS))


@pytest.fixture(scope="module")
def cluster(
    smol_packed: RuntimeConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("config")
    checking, faulty = folder / "checking.toml", folder / "faulty.toml"
    checking.write_text("[net]\nspot_check_every = 1\n")
    faulty.write_text(f'[runtime]\ntest_flip_byte = "{FLIP}"\n')
    flags = [
        ["--span", "0:15", "--threads", "1", "--config", str(checking)],
        ["--span", "15:30", "--threads", "1", "--config", str(faulty)],
        ["--span", "15:30", "--threads", "1"],
        ["--span", "15:30", "--threads", "1"],
    ]
    yield from serving_cluster(smol_packed, tmp_path_factory, flags)


async def test_a_node_with_a_flipped_byte_is_caught_named_and_routed_around(
    cluster: Cluster, references: list[Generated], flipped: list[Generated]
) -> None:
    # the fault changes the text: without the checks a stream through it would differ
    assert [g.text for g in flipped] != [g.text for g in references]
    entry = cluster.addresses[0]
    client = SwarmClient(entry, timeout_s=300)
    streams = [Replayed(prompt) for prompt in PROMPTS]
    await asyncio.gather(*(s.run(client, TOKENS) for s in streams))
    check(streams, references)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        status = await get_json(http, f"http://{entry}/status")
        bad = next(m["id"] for m in status["members"] if m["address"] == cluster.addresses[BAD])
        checks = status["spot_checks"]
        assert checks["left_out"] == [bad], checks
        assert checks["wrong_results"].get(bad, 0) >= 1, checks
        # N = 1: each mismatch convicted it at once, at most once per stream in flight (a
        # check under way as another convicts it), and nothing ran through it after
        entry_load = status["node"]["load"]["entry"]
        mismatches = entry_load["spot_check_mismatches"]
        assert 1 <= mismatches == checks["wrong_results"][bad] <= len(PROMPTS), entry_load
        assert entry_load["spot_checks_undecided"] == 0
        async with http.get(f"http://{entry}/metrics") as r:
            metrics = await r.text()
        assert f'swarm_wrong_results_total{{node="{bad}"}}' in metrics

    # a stream whose route went through it was replayed on another route
    rerouted = [f for s in streams for f in s.failovers if f.failed == bad]
    through_bad = [s for s in streams if s.stream.trace and bad in _route(s)]
    assert not through_bad, "a stream ended on a route through the convicted node"
    # later requests never go through it
    later = [Replayed(prompt) for prompt in PROMPTS]
    await asyncio.gather(*(s.run(client, TOKENS) for s in later))
    check(later, references)
    assert all(bad not in _route(s) for s in later)
    print(f"\nconvicted {bad}; {len(rerouted)} stream(s) re-routed off it")


def _route(stream: Replayed) -> set[str]:
    trace = stream.stream.trace
    return set() if trace is None else {hop.node for hop in trace.route}
