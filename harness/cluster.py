"""Real node processes on loopback for end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.forked_nodes import ForkedNode, node_argv
from harness.polling import until
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import NodeProcess, free_ports, start_node, stop_nodes, wait_for_coverage
from swarm.schema import RequestRecord


@dataclass
class Cluster:
    addresses: list[str]
    processes: list[NodeProcess] = field(default_factory=list)
    runtime: RuntimeConfig | None = None
    state_dir: Path = Path()
    flags: list[list[str]] = field(default_factory=list)
    started: Callable[[int, int], None] | None = None  # (node index, pid) once it runs
    # forked from a process that already imported swarm, torch and transformers (seconds of
    # CPU saved per node); False: a fresh `python -m swarm node`, for a node's own memory
    forked: bool = True
    # where the first node joins: another cluster's node (its swarm then holds both), else
    # nowhere (it bootstraps the others)
    join: str | None = None

    def stop(self) -> None:
        stop_nodes(self.processes)

    def start(self, i: int, *, alone: bool = False) -> None:
        """(Re)start node i on its port, so it keeps its node id; it joins through another,
        or, `alone`, through nothing but the addresses its state folder remembers (a lab
        started again after a power cut)."""
        if self.runtime is None:
            raise ValueError("a cluster needs its runtime config to start nodes")
        port = int(self.addresses[i].rpartition(":")[2])
        join = None if len(self.addresses) == 1 else self.addresses[1 if i == 0 else 0]
        if alone:  # a lab started again after a power cut
            join = None
        elif not self.processes:  # the very first node bootstraps the others
            join = self.join
        if self.forked:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            argv = node_argv(port, join, self.state_dir, self.runtime, self.flags[i])
            process: NodeProcess = ForkedNode(argv, self.state_dir / f"node-{port}.log")
        else:
            process = start_node(port, join, self.state_dir, self.runtime, self.flags[i])
        if self.started is not None:
            self.started(i, process.pid)
        if i < len(self.processes):
            self.processes[i] = process
        else:
            self.processes.append(process)

    def terminate(self, i: int, timeout_s: float = 60.0) -> int:
        """SIGTERM node i (a graceful leave) and wait for it to exit; its exit code."""
        self.processes[i].send_signal(signal.SIGTERM)
        return self.processes[i].wait(timeout=timeout_s)

    def index_of(self, address: str) -> int:
        return self.addresses.index(address)


async def start_cluster(
    runtime: RuntimeConfig,
    state_dir: Path,
    node_flags: Sequence[Sequence[str]],
    expect_serving: int,
    timeout_s: float = 240.0,
    token: str | None = None,
    started: Callable[[int, int], None] | None = None,
    ports: Sequence[int] | None = None,
    forked: bool = True,
    join: str | None = None,
) -> Cluster:
    """One node per entry of `node_flags`, the first being everyone's bootstrap; returns once
    every layer is covered by `expect_serving` serving members. `token`: the API token the
    nodes were configured with, if any. `started(i, pid)` runs as each node process starts
    (e.g. to put it under a CPU quota before it measures its speed). `ports`: one per node
    (clusters started at once take theirs from one `free_ports` call, so none is handed out
    twice); free ones by default. `forked`: see `Cluster.forked`; `join`: `Cluster.join`."""
    ports = list(ports) if ports is not None else free_ports(len(node_flags))
    cluster = Cluster(
        [f"127.0.0.1:{p}" for p in ports],
        runtime=runtime,
        state_dir=state_dir,
        flags=[list(f) for f in node_flags],
        started=started,
        forked=forked,
        join=join,
    )
    try:
        for i in range(len(node_flags)):
            # in a thread: the first forked start waits for the fork server's imports
            await asyncio.to_thread(cluster.start, i)
        await wait_for_coverage(cluster.addresses[0], expect_serving, timeout_s, token)
    except BaseException:
        cluster.stop()
        raise
    return cluster


async def get_json(http: aiohttp.ClientSession, url: str) -> Any:
    """What `url` answers, as JSON."""
    async with http.get(url) as r:
        return await r.json()


async def greedy_chat(
    http: aiohttp.ClientSession, address: str, prompt: str, max_tokens: int
) -> dict[str, Any]:
    """One greedy chat completion through `address`; the answer's JSON."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    async with http.post(f"http://{address}/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        answer: dict[str, Any] = await r.json()
    return answer


async def newest_request(address: str, count: int, token: str | None = None) -> RequestRecord:
    """The node's newest recent request, once it has recorded `count` of them."""
    client = SwarmClient(address, token=token)

    async def recorded() -> tuple[RequestRecord, ...]:
        records = (await client.status()).recent_requests
        return records if len(records) >= count else ()

    records = await until(recorded, f"the node recording {count} requests", 30, every_s=0.2)
    return max(records, key=lambda r: r.started_unix)


def serving_cluster(
    runtime: RuntimeConfig,
    tmp_path_factory: pytest.TempPathFactory,
    flags: list[list[str]],
    token: str | None = None,
) -> Iterator[Cluster]:
    """A module fixture's body: the cluster once every layer is served, stopped after.
    `token`: the API token the nodes were configured with, if any."""
    state = tmp_path_factory.mktemp("cluster") / "state"
    cluster = asyncio.run(
        start_cluster(runtime, state, flags, expect_serving=len(flags), token=token)
    )
    try:
        yield cluster
    finally:
        cluster.stop()


def node_behind_token(
    runtime: RuntimeConfig, tmp_path_factory: pytest.TempPathFactory, token: str, api: str = ""
) -> Iterator[Cluster]:
    """A module fixture's body: one node on one thread whose API asks for `token`, with the
    other `[api]` lines `api` gives (TOML, one setting a line)."""
    config = tmp_path_factory.mktemp("config") / "bootstrap.toml"
    config.write_text(f'[api]\ntoken = "{token}"\n{api}')
    flags = [["--threads", "1", "--config", str(config)]]
    yield from serving_cluster(runtime, tmp_path_factory, flags, token=token)


async def restore(cluster: Cluster, i: int, copies: int = 1) -> None:
    """Wake node i if it is frozen, start it again if it exited, and wait until every node
    serves layers again and every layer has `copies` holders. A cluster with memory for two
    copies of the model should be back to two before its next fault: with the restarted
    node still taking its span, one more fault can leave a layer with no holder at all (two
    faults at once, not the one a round means), and its request then waits on a reload."""
    with contextlib.suppress(ProcessLookupError):
        cluster.processes[i].send_signal(signal.SIGCONT)
    if cluster.processes[i].poll() is not None:
        cluster.start(i)
    await wait_for_coverage(cluster.addresses[0], len(cluster.addresses), 240.0, copies=copies)
