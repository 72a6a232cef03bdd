"""Nodes started with a Hugging Face repository, from a local stand-in of the hub (one per
node, so each log is one node's): a 2-node swarm answers what one process answers from the
same files, and each node downloaded only the shards, or the GGUF byte ranges, of what it
serves. The second node takes the parts the first one holds (embedding, head, the layer it
times itself on) from that peer, and only its own layers from the hub."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from harness.cluster import greedy_chat
from harness.factories import write_sharded_llama
from harness.family_models import SPECS, build_model, write_gguf
from harness.hub_standin import HubStandin
from harness.polling import until
from harness.reference import complete_locally, generate_locally
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import free_ports, start_node, stop_nodes, wait_for_coverage
from swarm.errors import SwarmError
from swarm.runtime.checkpoint.gguf_file import read_table
from swarm.transfer.hub import HEAD_BYTES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOKENS = 8
RAW_PROMPT = "ab cd ef gh"
REPO = "owner/tiny"


async def _serving(address: str, deadline_s: float = 120.0) -> None:
    client = SwarmClient(address)

    async def serves() -> bool:
        return (await client.status()).node.span is not None

    not_yet = (SwarmError, aiohttp.ClientError, OSError)
    await until(serves, f"{address} serving", deadline_s, every_s=0.3, ignoring=not_yet)


async def _ask(address: str, prompt: str | None) -> str:
    """A greedy chat answer to `prompt`; None: a raw completion of RAW_PROMPT."""
    async with aiohttp.ClientSession() as http:
        if prompt is not None:
            answer = await greedy_chat(http, address, prompt, TOKENS)
            text: str = answer["choices"][0]["message"]["content"]
            return text
        body = {"prompt": RAW_PROMPT, "max_tokens": TOKENS, "temperature": 0}
        async with http.post(f"http://{address}/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            text = (await r.json())["choices"][0]["text"]
            return text


def _run_swarm(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    hubs: list[HubStandin],
    ref: str,
    spans: list[str],
    dtype: str,
    prompt: str | None,
    reference: Callable[[], str],
) -> tuple[str, str]:
    """The swarm's answer and `reference()`, computed here while the first node starts."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    ports = free_ports(2)
    first = f"127.0.0.1:{ports[0]}"
    processes = []
    try:
        for i, (hub, span) in enumerate(zip(hubs, spans, strict=True)):
            monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)  # the node process reads it
            runtime = RuntimeConfig(model=ref, cache_dir=tmp_path / f"c{i}", dtype=dtype)
            flags = ["--span", span, "--threads", "1"]
            join = None if i == 0 else first
            processes.append(start_node(ports[i], join, tmp_path / "state", runtime, flags))
            if i == 0:  # serving, so the second finds the parts it holds
                expected = reference()
                asyncio.run(_serving(first))
        asyncio.run(wait_for_coverage(first, 2, 120.0))
        return asyncio.run(_ask(first, prompt)), expected
    finally:
        stop_nodes(processes)


def _shards_of(repo: Path, layers: range, entry: bool) -> set[str]:
    weight_map: dict[str, str] = json.loads((repo / "model.safetensors.index.json").read_text())[
        "weight_map"
    ]

    def wanted(name: str) -> bool:
        if any(name.startswith(f"model.layers.{i}.") for i in layers):
            return True
        return entry and not name.startswith("model.layers.")

    return {shard for name, shard in weight_map.items() if wanted(name)}


def _whole(hub: HubStandin, repo: Path, file: str) -> bool:
    return hub.fetched(REPO, file) == [(0, (repo / file).stat().st_size)]


def test_nodes_on_a_safetensors_repository_download_their_shards_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = write_sharded_llama(tmp_path)
    prompt = "w5 w6 w7 w8"
    local = RuntimeConfig(model=str(repo), cache_dir=tmp_path / "ref", dtype="float32")

    def reference() -> str:
        return asyncio.run(generate_locally(local, [prompt], TOKENS))[0].text

    with HubStandin({REPO: repo}) as hub_a, HubStandin({REPO: repo}) as hub_b:
        text, expected = _run_swarm(
            tmp_path,
            monkeypatch,
            [hub_a, hub_b],
            REPO,
            ["0:2", "2:4"],
            "float32",
            prompt,
            reference,
        )
    assert text == expected
    shards = sorted(p.name for p in repo.glob("*.safetensors"))
    got_a = {s for s in shards if _whole(hub_a, repo, s)}
    got_b = {s for s in shards if _whole(hub_b, repo, s)}
    # the first: the entry's parts and its layers; the second: its layers (the rest from a)
    assert got_a == _shards_of(repo, range(0, 2), entry=True)
    assert got_b == _shards_of(repo, range(2, 4), entry=False)
    assert got_a != set(shards) and got_b != set(shards)
    # of the other shards, each node read the header and nothing else
    for hub, got in ((hub_a, got_a), (hub_b, got_b)):
        for shard in set(shards) - got:
            ((start, end),) = hub.fetched(REPO, shard)
            assert start == 0 and end < (repo / shard).stat().st_size


def test_nodes_on_a_gguf_repository_download_their_byte_ranges_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = SPECS["llama"]
    repo = tmp_path / "gguf-repo"
    path = write_gguf(build_model(spec), spec, repo / "tiny-f32.gguf")
    (repo / "tiny-other.gguf").symlink_to(path)  # two GGUF files: the reference names one
    local = RuntimeConfig(model=str(path), cache_dir=tmp_path / "ref", threads=1)
    ref = f"{REPO}:tiny-f32.gguf"
    with HubStandin({REPO: repo}) as hub_a, HubStandin({REPO: repo}) as hub_b:
        text, expected = _run_swarm(
            tmp_path,
            monkeypatch,
            [hub_a, hub_b],
            ref,
            ["0:2", "2:4"],
            local.dtype,
            None,
            lambda: asyncio.run(complete_locally(local, RAW_PROMPT, TOKENS)),
        )
    assert text == expected
    table = read_table(path)

    def tensors(*prefixes: str) -> set[tuple[int, int]]:
        return {
            (t.offset, t.offset + t.nbytes)
            for name, t in table.tensors.items()
            if name.startswith(prefixes)
        }

    def covered(spans: list[tuple[int, int]], wanted: set[tuple[int, int]]) -> bool:
        return all(any(a <= s and e <= b for a, b in spans) for s, e in wanted)

    assert not hub_a.fetched(REPO, "tiny-other.gguf")
    got_a = hub_a.fetched(REPO, "tiny-f32.gguf")
    got_b = hub_b.fetched(REPO, "tiny-f32.gguf")
    own_a = tensors("token_embd.", "output", "blk.0.", "blk.1.")
    own_b = tensors("blk.2.", "blk.3.")  # the entry's parts and layer 0 came from the first
    assert covered(got_a, own_a) and covered(got_b, own_b)
    assert not covered(got_b, tensors("blk.0.")) and not covered(got_b, tensors("blk.1."))
    header = max(HEAD_BYTES, 2 * table.data_offset)  # the header, read in growing pieces
    for got, own in ((got_a, own_a), (got_b, own_b)):
        fetched = sum(end - start for start, end in got)
        assert fetched <= header + sum(e - s for s, e in own) + 4096 * len(own)
    assert sum(end - start for start, end in got_b) < path.stat().st_size / 2
