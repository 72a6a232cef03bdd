"""The prompt cache through real node processes: three nodes on the embedded model's packed
layers, each pinned to a third of them, with a KV budget of a few hundred positions. A
conversation's next turn starts after the blocks every hop kept from the turn before, says
so in its usage, and answers exactly as one process computing every prompt whole does; a
hop that dropped the blocks for room makes the entry send the prompt whole, and the text is
the same again, and after a hop was killed and started again; a hop stopped gracefully
reads its blocks back when it starts again."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from harness.cluster import Cluster, get_json, restore, serving_cluster
from harness.reference import converse_locally, generate_locally
from swarm.config import RuntimeConfig
from swarm.inference.entry_side import kv_bytes_per_token_layer
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SYSTEM = (
    "You are the help desk of a public library. Answer briefly and kindly, point to the "
    "right shelf or service, and say so when you do not know. The library opens at nine, "
    "closes at six, lends books for three weeks, and has a reading room on the second floor "
    "with quiet desks, a children's corner by the entrance and a cafe in the basement. "
) * 2
TURNS = ["Where can I read newspapers?", "Can I renew a book online?", "Is there wifi?"]
TOKENS = 24
POSITIONS = 640  # the KV budget of each node: positions of the layers it holds
LAYERS = 10  # each node's, of 30
CHUNK = RuntimeConfig().prefill_chunk_tokens  # a kept block's positions


@pytest.fixture(scope="module")
def three_nodes(
    smol_packed: RuntimeConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    context = ModelContext.open(smol_packed, progress=False)
    config = tmp_path_factory.mktemp("config") / "bootstrap.toml"
    budget = POSITIONS * LAYERS * kv_bytes_per_token_layer(context)
    config.write_text(f"[runtime]\nkv_cache_bytes = {budget}\n")
    # pinned: a node started again serves the layers it served, so the entry, which sent
    # it the blocks, asks it for them
    flags = [
        ["--span", f"{start}:{start + LAYERS}", "--threads", "1", "--config", str(config)]
        for start in range(0, context.num_layers, LAYERS)
    ]
    yield from serving_cluster(smol_packed, tmp_path_factory, flags)


@pytest.fixture(scope="module")
def conversation(smol_packed: RuntimeConfig) -> list[list[dict[str, str]]]:
    return asyncio.run(converse_locally(smol_packed, SYSTEM, TURNS, TOKENS))


async def _chat(
    http: aiohttp.ClientSession,
    entry: str,
    messages: list[dict[str, str]],
    until_served_s: float = 0.0,
) -> Any:
    """The greedy answer; `until_served_s`: asked again while the swarm answers 503 (as
    after a restart, until the entry lifts its ban on the node), as a client would."""
    body = {"messages": messages, "max_tokens": TOKENS, "temperature": 0}
    deadline = time.monotonic() + until_served_s
    while True:
        async with http.post(f"http://{entry}/v1/chat/completions", json=body) as r:
            if r.status == 503 and time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                continue
            assert r.status == 200, await r.text()
            return await r.json()


async def _blocks(http: aiohttp.ClientSession, cluster: Cluster) -> list[dict[str, int]]:
    statuses = [await get_json(http, f"http://{a}/status") for a in cluster.addresses]
    return [s["node"]["load"]["prompt_cache"] for s in statuses]


async def test_each_turn_starts_from_the_last_and_answers_as_one_process(
    three_nodes: Cluster, conversation: list[list[dict[str, str]]]
) -> None:
    entry = three_nodes.addresses[0]
    async with aiohttp.ClientSession() as http:
        cached, prompts = [], []
        for turn in conversation:
            answer = await _chat(http, entry, turn[:-1])
            assert answer["choices"][0]["message"]["content"] == turn[-1]["content"]
            usage = answer["usage"]
            cached.append(usage["prompt_tokens_details"]["cached_tokens"])
            prompts.append(usage["prompt_tokens"])
        # a turn's prompt starts with the one before it: every whole block of that one, of
        # CHUNK positions (runtime.prefill_chunk_tokens), was kept and is started from
        assert cached[0] == 0, cached
        for before, now, tokens in zip(prompts, cached[1:], prompts[1:], strict=False):
            assert before // CHUNK * CHUNK <= now <= (tokens - 1) // CHUNK * CHUNK, (
                prompts,
                cached,
            )
        assert cached[-1] > 0
        blocks = await _blocks(http, three_nodes)
        assert all(b["adopted"] > 0 and b["blocks"] > 0 for b in blocks)
        async with http.get(f"http://{entry}/metrics") as r:
            metrics = await r.text()
        assert 'swarm_tokens_total{kind="cached_prompt"}' in metrics
        assert "swarm_prompt_cache_blocks " in metrics


async def test_blocks_dropped_for_room_are_computed_again_with_the_same_text(
    three_nodes: Cluster, conversation: list[list[dict[str, str]]]
) -> None:
    entry = three_nodes.addresses[0]
    async with aiohttp.ClientSession() as http:
        await _chat(http, entry, conversation[1][:-1])  # its blocks are kept now
        # a prompt whose session needs most of every node's budget: the blocks make way
        long = [{"role": "user", "content": "Summarize: " + "the quick brown fox. " * 110}]
        body = {"messages": long, "max_tokens": 4, "temperature": 0}
        async with http.post(f"http://{entry}/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            assert POSITIONS - 128 < (await r.json())["usage"]["prompt_tokens"] < POSITIONS - 32
        missing = sum(b["missing"] for b in await _blocks(http, three_nodes))
        answer = await _chat(http, entry, conversation[1][:-1])
        assert answer["choices"][0]["message"]["content"] == conversation[1][-1]["content"]
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        after = sum(b["missing"] for b in await _blocks(http, three_nodes))
        assert after > missing


async def test_a_hop_killed_between_two_turns_loses_its_blocks_and_no_text(
    three_nodes: Cluster, conversation: list[list[dict[str, str]]]
) -> None:
    """kill -9 of a hop, started again with the same node id and nothing kept: the entry,
    which sent it the blocks, is told they are missing and sends the prompt whole."""
    entry = three_nodes.addresses[0]
    async with aiohttp.ClientSession() as http:
        await _chat(http, entry, conversation[2][:-1])  # kept everywhere now
        three_nodes.processes[1].send_signal(signal.SIGKILL)
        three_nodes.processes[1].wait(timeout=30)
        await restore(three_nodes, 1)
        answer = await _chat(http, entry, conversation[2][:-1], until_served_s=60)
        # the entry asked the new process for the blocks it had sent the old one
        assert answer["choices"][0]["message"]["content"] == conversation[2][-1]["content"]
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        blocks = await _blocks(http, three_nodes)
        assert blocks[1]["missing"] == 1
        # and the turn after it starts from the blocks that one kept again
        again = await _chat(http, entry, conversation[2][:-1])
        assert again["choices"][0]["message"]["content"] == conversation[2][-1]["content"]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_a_hop_stopped_and_started_again_reads_its_blocks_back(
    three_nodes: Cluster, conversation: list[list[dict[str, str]]]
) -> None:
    """SIGTERM (a graceful leave) writes the hop's kept blocks to its state folder; started
    again on its layers it reads them back, and the next turn starts from them."""
    entry = three_nodes.addresses[0]
    async with aiohttp.ClientSession() as http:
        await _chat(http, entry, conversation[1][:-1])  # kept everywhere now
        assert three_nodes.terminate(1) == 0
        await restore(three_nodes, 1)
        assert (await _blocks(http, three_nodes))[1]["blocks"] > 0
        answer = await _chat(http, entry, conversation[1][:-1], until_served_s=60)
        assert answer["choices"][0]["message"]["content"] == conversation[1][-1]["content"]
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_a_prompt_whose_last_chunk_is_one_token_answers_as_one_process(
    three_nodes: Cluster, smol_packed: RuntimeConfig
) -> None:
    """A prompt of 2 x CHUNK + 1 tokens: its last chunk is one row, which each hop runs where
    decode steps run, ahead of prefill chunks still waiting there unless the entry holds it
    back until the chunks before it have come back (every prompt 64k + 1 tokens long failed
    with "step at position 128, but the cache holds 64")."""
    entry_model = EntryModel(ModelContext.open(smol_packed, progress=False))
    words = "Tell me about the old lighthouse on the northern cliffs"
    prompt = words
    while len(entry_model.encode_chat([{"role": "user", "content": prompt}])) % CHUNK != 1 or (
        len(entry_model.encode_chat([{"role": "user", "content": prompt}])) < 2 * CHUNK
    ):
        prompt += " and the sea"
    (reference,) = await generate_locally(smol_packed, [prompt], TOKENS)
    entry = three_nodes.addresses[0]
    async with aiohttp.ClientSession() as http:
        for cache in (False, True, True):
            body = {
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": TOKENS,
                "temperature": 0,
                "cache_prompt": cache,
            }
            async with http.post(f"http://{entry}/v1/chat/completions", json=body) as r:
                assert r.status == 200, await r.text()
                answer = await r.json()
            assert answer["choices"][0]["message"]["content"] == reference.text
            assert answer["usage"]["prompt_tokens"] % CHUNK == 1
