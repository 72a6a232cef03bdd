"""No request lost, with pinned spans: 4 node processes on the embedded model, two servers for
every layer, 8 concurrent greedy streams. A middle hop killed (-9) during the prefill or frozen
(SIGSTOP) never changes a stream's text: each is what one process makes. Faults at decode steps,
under automatic placement, are the chaos rounds of tests/test_chaos_e2e.py."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Iterator

import aiohttp
import pytest

from swarm.config import RuntimeConfig
from swarm.demo import wait_for_coverage
from tests.cluster import Cluster, four_node_cluster, restore
from tests.reference import Generated
from tests.streams import (
    PROMPTS,
    STREAMS,
    Stream,
    check,
    get_json,
    poll,
    reference_answers,
    run_stream,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def references(smol_runtime: RuntimeConfig) -> list[Generated]:
    return reference_answers(smol_runtime)


@pytest.fixture(scope="module")
def four_nodes(
    smol_runtime: RuntimeConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    # Two stages of two replicas, pinned: the chaos test covers automatic placement.
    flags = [["--span", span, "--threads", "1"] for span in ("0:15", "15:30") * 2]
    yield from four_node_cluster(smol_runtime, tmp_path_factory, flags)


async def _victim(http: aiohttp.ClientSession, cluster: Cluster) -> int:
    """The index of a node that is not the entry but carries the entry's sessions."""
    entry = cluster.addresses[0]

    async def routes() -> list[list[str]]:
        sessions = (await get_json(http, f"http://{entry}/status"))["sessions"]
        return [s["route"] for s in sessions] if len(sessions) == STREAMS else []

    status = await get_json(http, f"http://{entry}/status")
    me, addresses = status["node"]["id"], {m["id"]: m["address"] for m in status["members"]}
    used = Counter(node for route in await poll(routes, "routes") for node in route if node != me)
    return cluster.index_of(addresses[used.most_common(1)[0][0]])


async def test_kill_9_of_a_middle_hop_during_prefill_loses_no_stream(
    four_nodes: Cluster, references: list[Generated]
) -> None:
    """Kills at decode steps are chaos rounds (tests/test_chaos_e2e.py); this one kills a hop
    while it runs the long prefill of every stream."""
    streams = [Stream(prompt) for prompt in PROMPTS]
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        running = [
            asyncio.create_task(run_stream(http, four_nodes.addresses[0], s)) for s in streams
        ]
        victim = await _victim(http, four_nodes)
        seen = max(s.tokens_seen for s in streams)
        four_nodes.processes[victim].kill()
        await asyncio.gather(*running)
    try:
        assert seen == 0, "the hop was killed after the prefill"
        check(streams, references)
        failed_over = [s for s in streams if s.trace and s.trace["failovers"]]
        assert failed_over, "no stream went through the killed hop"
    finally:
        await restore(four_nodes, victim)


async def test_a_frozen_hop_is_routed_around_and_serves_again_after_sigcont(
    four_nodes: Cluster, references: list[Generated]
) -> None:
    streams = [Stream(prompt) for prompt in PROMPTS]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        running = [
            asyncio.create_task(run_stream(http, four_nodes.addresses[0], s)) for s in streams
        ]
        victim = await _victim(http, four_nodes)
        await poll(lambda: any(s.tokens_seen >= 4 for s in streams), "a few tokens")
        four_nodes.processes[victim].send_signal(signal.SIGSTOP)
        try:
            await asyncio.gather(*running)
        finally:
            four_nodes.processes[victim].send_signal(signal.SIGCONT)
        check(streams, references)
        waits = [f["waited_ms"] for s in streams if s.trace for f in s.trace["failovers"]]
        assert waits, "no stream went through the frozen hop"
        # local preset: a late step (deadline floor 1 s) and an unanswered probe (1 s)
        assert max(waits) < 5000, waits

        # after SIGCONT the node refutes its suspicion and serves requests again
        thawed = four_nodes.addresses[victim]
        await wait_for_coverage(thawed, 4, 120.0)
        revived = Stream(PROMPTS[0])
        await run_stream(http, thawed, revived)
        check([revived], references[:1])


async def test_when_layers_are_missing_a_request_fails_fast_naming_them(
    four_nodes: Cluster,
) -> None:
    """Runs last: it leaves layers 15:30 without a server."""
    entry = four_nodes.addresses[0]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        status = await get_json(http, f"http://{entry}/status")
        second_stage = [
            four_nodes.index_of(m["address"]) for m in status["members"] if m["span"] == [15, 30]
        ]
        assert len(second_stage) == 2
        for i in second_stage:
            four_nodes.processes[i].kill()
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        for _ in range(2):  # right after the kill (data path), then once membership knows
            started = time.monotonic()
            async with http.post(f"http://{entry}/v1/chat/completions", json=body) as r:
                error = await r.json()
                assert r.status == 503, error
                assert "15:30" in error["error"]["message"]
                assert int(r.headers["Retry-After"]) > 0
            assert time.monotonic() - started < 10.0
            await wait_for_missing(http, entry)


async def wait_for_missing(http: aiohttp.ClientSession, entry: str) -> None:
    async def missing() -> bool:
        status = await get_json(http, f"http://{entry}/status")
        return bool(status["coverage"]["missing"])

    await poll(missing, "membership to see the missing layers")
