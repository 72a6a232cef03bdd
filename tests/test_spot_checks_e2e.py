"""A node that computes wrong text is caught, and cured: 4 node processes on the embedded
model (packed, on swarm's kernels), the entry serving layers 0:15 and three nodes 15:30, one
of which has one byte of layer 20 flipped in memory at its first load (runtime.
test_flip_byte, tests only), which changes the greedy text of these prompts. The entry
checks every step (net.spot_check_every = 1), so N = 1: the first step whose bits the fault
changes, on a stream's route or on a shadow run through the bad node, convicts it before its
token reaches a client (a flipped weight whose input rounds to zero changes nothing, and
such steps pass, rightly). Three concurrent greedy streams (the entry spreads them over the
three holders) must each be what one process makes; the entry names the node in /status and
/metrics and asks it to reload its layers; the node checks its stored parts against their
hashes, reloads them into fresh blocks (without the flipped byte) and says so in its record,
and the entry lets it back in: later streams through it pass every check, with one
process's text."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import aiohttp
import pytest

from harness.cluster import Cluster, get_json, serving_cluster
from harness.polling import until
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


async def test_a_node_with_a_flipped_byte_is_caught_named_reloaded_and_let_back_in(
    cluster: Cluster, references: list[Generated], flipped: list[Generated]
) -> None:
    # the fault changes the text: without the checks a stream through it would differ
    assert [g.text for g in flipped] != [g.text for g in references]
    entry, bad_address = cluster.addresses[0], cluster.addresses[BAD]
    client = SwarmClient(entry, timeout_s=300)
    streams = [Replayed(prompt) for prompt in PROMPTS]
    await asyncio.gather(*(s.run(client, TOKENS) for s in streams))
    check(streams, references)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        status = await get_json(http, f"http://{entry}/status")
        bad = next(m["id"] for m in status["members"] if m["address"] == bad_address)
        checks = status["spot_checks"]
        assert checks["wrong_results"].get(bad, 0) >= 1, checks
        assert checks["reloads_asked"].get(bad, 0) >= 1, checks
        # N = 1: each mismatch convicted it at once, at most once per stream in flight (a
        # check under way as another convicts it), and nothing ran through it after
        entry_load = status["node"]["load"]["entry"]
        mismatches = entry_load["spot_check_mismatches"]
        assert 1 <= mismatches == checks["wrong_results"][bad] <= len(PROMPTS), entry_load
        assert entry_load["spot_checks_undecided"] == 0
        async with http.get(f"http://{entry}/metrics") as r:
            metrics = await r.text()
        assert f'swarm_wrong_results_total{{node="{bad}"}}' in metrics
        assert f'swarm_reloads_asked_total{{node="{bad}"}}' in metrics

        # the bad node reloads once (a second request within the interval is refused), and
        # the entry lets it back in on seeing that in its record
        async def reloaded() -> bool:
            hop = (await get_json(http, f"http://{bad_address}/status"))["node"]["load"]["hop"]
            back = (await get_json(http, f"http://{entry}/status"))["spot_checks"]["left_out"]
            return hop["reloads"] == 1 and back == []

        await until(reloaded, "the convicted node reloading and being let back in", 30)
        async with http.get(f"http://{bad_address}/metrics") as r:
            assert "swarm_layer_reloads_total 1.0" in await r.text()
        line = _reload_line(cluster, BAD)
        assert "all 15 stored parts matched their recorded hashes" in line, line
        before = (await get_json(http, f"http://{entry}/status"))["node"]["load"]["entry"]

        # later streams go through it again (the entry spreads them over the three holders)
        # and pass every check there: the reload cured it
        through_bad: list[Replayed] = []
        for _ in range(3):
            later = [Replayed(prompt) for prompt in PROMPTS]
            await asyncio.gather(*(s.run(client, TOKENS) for s in later))
            check(later, references)
            through_bad += [s for s in later if bad in _route(s)]
            if through_bad:
                break
        assert through_bad, "no later stream went through the reloaded node"
        after = (await get_json(http, f"http://{entry}/status"))["node"]["load"]["entry"]
        assert after["spot_checks"] > before["spot_checks"]
        assert after["spot_check_mismatches"] == before["spot_check_mismatches"], after
    print(f"\nconvicted {bad}; {len(through_bad)} later stream(s) through it; it logged:\n{line}")


def _reload_line(cluster: Cluster, i: int) -> str:
    """The line node i logged as it reloaded its layers."""
    port = cluster.addresses[i].rpartition(":")[2]
    log = (cluster.state_dir / f"node-{port}.log").read_text()
    (line,) = [line for line in log.splitlines() if "reloaded them from the store" in line]
    return line


def _route(stream: Replayed) -> set[str]:
    trace = stream.stream.trace
    return set() if trace is None else {hop.node for hop in trace.route}
