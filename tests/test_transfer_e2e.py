"""Weights travel between real node processes: only the first node has the model file; the
others start with its id or name, fetch what they serve from their peers, and the swarm answers
exactly what one process does. A peer whose stored weights went bad on disk is caught by the
digest and avoided, and itself fetches them again when it starts next; a node asking for
another model is refused."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from harness.cluster import greedy_chat
from harness.factories import write_tiny_llama
from harness.polling import until
from harness.reference import generate_locally
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import free_ports, start_node, stop_nodes
from swarm.runtime.checkpoint.manifest import CHUNK_BYTES
from swarm.schema import NodeStatus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WIDE = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 6}
LAYER_BYTES = 4_000_000  # a little over one layer of WIDE in float32
PROMPT = "w5 w6 w7 w8"
TOKENS = 12
DEADLINE_S = 120.0


async def _status_once(address: str, done: Callable[[NodeStatus], bool], what: str) -> NodeStatus:
    """The node's status once `done(status)` holds."""
    client = SwarmClient(address)

    async def holds() -> NodeStatus | None:
        status = await client.status()
        return status if done(status) else None

    not_yet = (Exception,)  # not listening yet, or not answering
    return await until(holds, what, DEADLINE_S, every_s=0.3, ignoring=not_yet)


def _serving(count: int) -> Callable[[NodeStatus], bool]:
    def done(status: NodeStatus) -> bool:
        spans = [m for m in status.members if m.state == "alive" and m.span]
        return status.coverage.complete and len(spans) >= count

    return done


def test_nodes_without_the_file_fetch_their_spans_and_answer_exactly(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    write_tiny_llama(folder, **WIDE)
    runtime = RuntimeConfig(model=str(folder), cache_dir=tmp_path / "c0", dtype="float32")
    (reference,) = asyncio.run(generate_locally(runtime, [PROMPT], TOKENS))
    ports = free_ports(3)
    a, b, c = (f"127.0.0.1:{p}" for p in ports)
    state = tmp_path / "state"
    flags = ["--layer-memory-bytes", str(3 * LAYER_BYTES), "--threads", "1"]
    processes = [start_node(ports[0], None, state, runtime, flags)]
    try:
        first = asyncio.run(_status_once(a, lambda s: s.node.span is not None, "the first span"))
        model_id = first.model.id

        def fetching(i: int, ref: str) -> list[str]:
            return [*flags, "--model", ref, "--cache-dir", str(tmp_path / f"c{i}")]

        processes.append(start_node(ports[1], a, state, runtime, fetching(1, model_id[:12])))
        asyncio.run(_status_once(a, _serving(2), "two nodes serving"))
        # the second node's copy of the embedding goes bad on disk (it holds it in memory)
        (stored,) = (tmp_path / "c1").glob("peer-*/embed.safetensors")
        _spoil(stored)
        # the third asks for the model by name, through the second node
        processes.append(start_node(ports[2], b, state, runtime, fetching(2, "model")))
        node = [sys.executable, "-m", "swarm", "node", "--preset", "local", "--port", "0"]
        other = ["--model", "0123456789abcdef", "--cache-dir", str(tmp_path / "c3")]
        refused = subprocess.run(
            [*node, "--state-dir", str(state / "other"), "--join", a, *other],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode != 0
        assert "no peer serves model '0123456789abcdef'" in refused.stderr
        status = asyncio.run(_status_once(a, _serving(3), "three nodes serving"))
        spans = {m.address: m.span for m in status.members}
        assert all(spans[x] for x in (a, b, c))
        third = asyncio.run(SwarmClient(c).status())
        assert third.transfer.bad_peers == (b,)
        assert third.transfer.parts_done >= 3 and not third.transfer.active
        assert [p.name for p in (tmp_path / "c2").glob("peer-*/*.partial*")] == []
        metrics = asyncio.run(_get(f"http://{c}/metrics"))
        assert "swarm_transfer_bad_peers 1.0" in metrics
        for entry in (a, b, c):
            answer = asyncio.run(_chat(entry))
            assert answer == reference.text
        # stopped, the second node finds its embedding and layers changed on disk when it
        # starts again: it discards them, fetches them again and loads none of them
        stop_nodes([processes[1]])
        for layer in (tmp_path / "c1").glob("peer-*/layer-*.safetensors"):
            _spoil(layer)
        processes[1] = start_node(ports[1], a, state, runtime, fetching(1, model_id[:12]))
        back = asyncio.run(
            _status_once(b, lambda s: s.node.span is not None and s.coverage.complete, "b again")
        )
        assert back.transfer.parts_done >= 2  # the embedding and at least one layer
        assert asyncio.run(_chat(b)) == reference.text
    finally:
        stop_nodes(processes)


def _spoil(stored: Path) -> None:
    """A byte changed in every chunk of a stored part, as a failing disk would."""
    data = bytearray(stored.read_bytes())
    for i in range(0, len(data), CHUNK_BYTES):
        data[i + 100] ^= 0xFF
    stored.write_bytes(bytes(data))


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        return await r.text()


async def _chat(address: str) -> str:
    async with aiohttp.ClientSession() as http:
        answer = await greedy_chat(http, address, PROMPT, TOKENS)
    return str(answer["choices"][0]["message"]["content"])
