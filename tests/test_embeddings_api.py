"""/v1/embeddings, /api/embed and /api/embeddings on a real socket in front of the inference
service running a tiny random Llama in this process: the official `openai` and `ollama`
clients, vectors equal to the service's own pooling, refusals by name, and every session
closed after."""

from __future__ import annotations

import base64
import dataclasses
import math
import struct
from collections.abc import AsyncIterator

import aiohttp
import ollama
import openai
import pytest
import torch

from harness.api_server import MODEL, TOKEN, Served, openai_client, policy, serve
from swarm.config import RuntimeConfig
from swarm.inference.embedding import embed_all
from swarm.inference.local import load_local
from swarm.runtime.execution.pooling import unit
from swarm.types import SessionId

TEXTS = ["w5 w6 w7", "w9 w10 w11 w12"]


@pytest.fixture
async def served(tiny_runtime: RuntimeConfig) -> AsyncIterator[Served]:
    async with serve(tiny_runtime, policy()) as s:
        yield s


async def _reference(served: Served, texts: list[str], normalize: bool = True) -> list[list[float]]:
    entry = served.local.entry
    ids = [entry.encode_text(t) for t in texts]
    local = served.local
    return await embed_all(entry, local.pipeline, local.compute, ids, "last", normalize)


async def test_the_openai_client_gets_the_services_vectors_as_floats_and_base64(
    served: Served,
) -> None:
    async with openai_client(served) as client:
        await _through_openai(served, client)


async def _through_openai(served: Served, client: openai.AsyncOpenAI) -> None:
    expected = await _reference(served, TEXTS)
    one = await client.embeddings.create(model=MODEL, input=TEXTS[0])
    assert [d.embedding for d in one.data] == expected[:1]
    assert math.isclose(sum(x * x for x in one.data[0].embedding), 1.0, rel_tol=1e-5)
    assert one.model == MODEL and one.usage.prompt_tokens == one.usage.total_tokens > 0

    batch = await client.embeddings.create(model=MODEL, input=TEXTS)
    assert [d.index for d in batch.data] == [0, 1]
    assert [d.embedding for d in batch.data] == expected
    width = served.local.entry.hidden_size
    assert len(expected[0]) == width

    # the client asks for base64 by default and decodes it with numpy; read it raw here too
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        body = {"input": TEXTS, "encoding_format": "base64", "dimensions": width}
        async with http.post(f"{served.url}/v1/embeddings", json=body) as r:
            assert r.status == 200, await r.text()
            answer = await r.json()
    for item, vector in zip(answer["data"], expected, strict=True):
        raw = base64.b64decode(item["embedding"])
        assert list(struct.unpack(f"<{width}f", raw)) == vector
    ids = served.local.entry.encode_text(TEXTS[1])
    by_ids = await client.embeddings.create(model=MODEL, input=[ids])
    assert by_ids.data[0].embedding == expected[1]
    assert served.kv_sessions() == 0  # every session closed on every shard


async def test_refusals_name_what_is_wrong(served: Served) -> None:
    long_text = " ".join(f"w{i}" for i in range(300))  # past the served context of 256
    vocab = served.local.entry.vocab_size
    cases = [
        ({"input": long_text}, 400, "input[0] has"),
        ({"input": [[vocab]]}, 400, "outside the vocabulary"),
        ({"input": "a", "model": "gpt-9"}, 404, "'tiny'"),
        ({"input": "a", "dimensions": 3}, 400, "dimensions"),
    ]
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        for body, status, fragment in cases:
            async with http.post(f"{served.url}/v1/embeddings", json=body) as r:
                error = (await r.json())["error"]
                assert (r.status, fragment in error["message"]) == (status, True), error
    assert served.kv_sessions() == 0


async def test_the_ollama_client_embeds_and_the_older_route_answers_as_pooled(
    served: Served,
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with ollama.AsyncClient(host=served.url, headers=headers) as client:
        await _through_ollama(served, client)


async def _through_ollama(served: Served, client: ollama.AsyncClient) -> None:
    expected = await _reference(served, TEXTS)
    got = await client.embed(model=MODEL, input=TEXTS)
    assert [list(v) for v in got.embeddings] == expected
    assert got.prompt_eval_count and got.prompt_eval_count > 0
    old = await client.embeddings(model=MODEL, prompt=TEXTS[0])
    assert list(old.embedding) == (await _reference(served, TEXTS[:1], normalize=False))[0]
    long_text = " ".join(f"w{i}" for i in range(300))
    cut = await client.embed(model=MODEL, input=long_text)  # truncated to the context
    assert cut.prompt_eval_count == 256
    with pytest.raises(ollama.ResponseError, match="input"):
        await client.embed(model=MODEL, input=long_text, truncate=False)
    assert served.kv_sessions() == 0


async def test_every_row_of_a_prefill_is_its_chunks_and_mean_pooling_reads_them_all(
    tiny_runtime: RuntimeConfig,
) -> None:
    """The rows a pooling over every position reads: each chunk's, in order, the last being
    the prefill's own last position, bit for bit."""
    local = await load_local(dataclasses.replace(tiny_runtime, prefill_chunk_tokens=4))
    try:
        ids = local.entry.encode_text("w1 w2 w3 w4 w5 w6 w7 w8 w9")
        hidden = await local.compute.run(local.entry.embed, ids)
        rows = await local.pipeline.prefill_rows(SessionId("rows"), hidden)
        last = await local.pipeline.forward(SessionId("last"), hidden, 0)
        assert rows.shape[1] == len(ids) > 8 and torch.equal(rows[:, -1], last[:, -1])
        (mean,) = await embed_all(local.entry, local.pipeline, local.compute, [ids], "mean")
        assert mean == unit(local.entry.normed(rows).mean(dim=0)).tolist()
        for shard in local.pipeline.shards:
            for session in ("rows", "last"):
                shard.close_session(SessionId(session))
        assert sum(shard.kv.snapshot()[0] for shard in local.pipeline.shards) == 0
    finally:
        local.compute.close()
