"""Every family, from its GGUF file (where swarm reads the family's) and from its HF folder,
through two real node processes that split its layers: the completion equals one process's,
whose tokens equal transformers' `generate`. A family's two clusters start at once, from
forked nodes (harness.forked_nodes, as every harness.cluster node), to keep the node starts
inside the suite's time budget. The GGUF
files carry no chat template (as base models): chat answers 400 there; the HF folders have one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from harness.cluster import Cluster, start_cluster
from harness.family_models import SPECS, WINDOW, Checkpoint, reference_tokens
from harness.reference import greedy
from swarm import cli
from swarm.config import RuntimeConfig
from swarm.demo import free_ports
from swarm.exits import WRONG_START
from swarm.inference.local import load_local
from swarm.runtime.execution.model import ModelContext
from swarm.telemetry import bytes_per_layer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPT_TEXT = "ab cd ef gh"  # 10 tokens
NEW_TOKENS = 12  # the last ones attend past the sliding window


async def one_process(runtime: RuntimeConfig, checkpoint: Checkpoint) -> str:
    """One process's completion of PROMPT_TEXT, after checking its tokens against
    transformers' `generate` on the same prompt ids."""
    local = await load_local(runtime)
    try:
        ids = local.entry.encode_text(PROMPT_TEXT)
        generated = await greedy(local, ids, NEW_TOKENS)
    finally:
        local.compute.close()
    tokens = generated.token_ids
    assert tokens == reference_tokens(checkpoint.model, ids, NEW_TOKENS), checkpoint.spec.name
    assert len(ids) + len(tokens) - 1 > WINDOW  # positions the last token was computed from
    return generated.text


async def _start(runtime: RuntimeConfig, state: Path, ports: list[int]) -> Cluster:
    context = await asyncio.to_thread(ModelContext.open, runtime, False)
    half = -(-context.num_layers // 2)  # room for half the layers: the two nodes must split
    flags = ["--layer-memory-bytes", str(half * bytes_per_layer(context)), "--threads", "1"]
    return await start_cluster(runtime, state, [flags, flags], expect_serving=2, ports=ports)


async def _start_all(runtimes: dict[str, RuntimeConfig], state: Path) -> dict[str, Cluster]:
    """Both formats' clusters at once: their start-up waits overlap."""
    ports = free_ports(2 * len(runtimes))
    started = await asyncio.gather(
        *(
            _start(runtime, state / fmt, ports[2 * i : 2 * i + 2])
            for i, (fmt, runtime) in enumerate(runtimes.items())
        ),
        return_exceptions=True,
    )
    clusters = {fmt: c for fmt, c in zip(runtimes, started, strict=True) if isinstance(c, Cluster)}
    failed = [e for e in started if isinstance(e, BaseException)]
    if failed:
        await _stop_all(clusters)
        raise failed[0]
    return clusters


async def _stop_all(clusters: dict[str, Cluster]) -> None:
    await asyncio.gather(*(asyncio.to_thread(c.stop) for c in clusters.values()))


async def _check_answers(
    http: aiohttp.ClientSession, cluster: Cluster, fmt: str, expected_text: str
) -> None:
    base = f"http://{cluster.addresses[1]}"
    body = {"prompt": PROMPT_TEXT, "max_tokens": NEW_TOKENS, "temperature": 0}
    async with http.post(f"{base}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    assert answer["choices"][0]["text"] == expected_text, fmt
    assert len(answer["swarm"]["route"]) == 2
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with http.post(f"{base}/v1/chat/completions", json=chat) as r:
        reply = await r.json()
        if fmt == "gguf":  # no chat template in the file
            assert r.status == 400, reply
            assert reply["error"]["code"] == "no_chat_template"
            assert "/v1/completions" in reply["error"]["message"]
        else:
            assert r.status == 200, reply


@pytest.mark.parametrize("family", sorted(SPECS))
async def test_two_nodes_split_each_family(
    family: str,
    family_checkpoints: dict[tuple[str, str], Checkpoint],
    family_cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runtimes = {
        fmt: RuntimeConfig(
            model=str(family_checkpoints[family, fmt].path), cache_dir=family_cache, threads=1
        )
        for fmt in SPECS[family].formats
    }
    expected = {  # before the nodes take the cores
        fmt: await one_process(runtime, family_checkpoints[family, fmt])
        for fmt, runtime in runtimes.items()
    }
    clusters = await _start_all(runtimes, tmp_path)
    try:
        async with aiohttp.ClientSession() as http:
            for fmt, cluster in clusters.items():
                await _check_answers(http, cluster, fmt, expected[fmt])
        if family == "qwen2":  # the CLI against a node, once
            await _cli_against(clusters["gguf"].addresses[0], expected["gguf"], capsys)
    finally:
        await _stop_all(clusters)


async def _cli_against(
    address: str, expected_text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`swarm generate --node --raw` asks for a completion; without --raw, a base model's
    refusal tells the user to add it."""
    args = ["generate", "--node", address, "--prompt", PROMPT_TEXT]
    args += ["--max-tokens", str(NEW_TOKENS)]
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, [*args, "--raw"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == expected_text
    assert await asyncio.to_thread(cli.main, args) == WRONG_START
    assert "use --raw" in capsys.readouterr().err
