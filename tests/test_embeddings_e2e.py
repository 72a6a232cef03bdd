"""Embeddings through real node processes: three nodes on the embedded model's packed layers,
each pinned to a third of them. The official `openai` client's vectors (one string and a
batch, as floats and as base64) and the `ollama` client's are the bits one process computes
for the same texts, two paraphrases lie closer than two unrelated sentences, and every
node's caches hold no session after."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import ollama
import openai
import pytest

from harness.cluster import Cluster, get_json, serving_cluster
from harness.polling import until
from harness.reference import embed_locally
from swarm.config import RuntimeConfig
from swarm.runtime.execution.model import ModelContext

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LAYERS = 10  # each node's, of 30
TEXTS = [
    "The cat sat on the mat.",
    "A cat was sitting on the rug.",
    "Stock markets fell sharply on Tuesday after the report.",
    # past one prefill chunk (64 positions), its last chunk longer than one row
    "The library opens at nine and closes at six; books are lent for three weeks. " * 6,
]


@pytest.fixture(scope="module")
def three_nodes(
    smol_packed: RuntimeConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    layers = ModelContext.open(smol_packed, progress=False).num_layers
    flags = [
        ["--span", f"{start}:{start + LAYERS}", "--threads", "1"]
        for start in range(0, layers, LAYERS)
    ]
    yield from serving_cluster(smol_packed, tmp_path_factory, flags)


@pytest.fixture(scope="module")
def reference(smol_packed: RuntimeConfig) -> list[list[float]]:
    return asyncio.run(embed_locally(smol_packed, TEXTS))


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


async def test_the_swarms_embeddings_are_one_process_bits(
    three_nodes: Cluster, reference: list[list[float]]
) -> None:
    entry = three_nodes.addresses[0]
    async with openai.AsyncOpenAI(base_url=f"http://{entry}/v1", api_key="-") as client:
        model = (await client.models.list()).data[0].id
        one = await client.embeddings.create(model=model, input=TEXTS[0], encoding_format="float")
        assert one.data[0].embedding == reference[0]
        batch = await client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
        assert [d.embedding for d in batch.data] == reference
        # the client's default: base64, which it decodes as little-endian float32
        packed = await client.embeddings.create(model=model, input=TEXTS)
        assert [list(d.embedding) for d in packed.data] == reference
        assert batch.usage.prompt_tokens > len(TEXTS)
    async with ollama.AsyncClient(host=f"http://{entry}") as ollama_client:
        embedded = await ollama_client.embed(model=model, input=TEXTS)
        assert [list(v) for v in embedded.embeddings] == reference
    cat, paraphrase, unrelated = reference[0], reference[1], reference[2]
    assert _dot(cat, paraphrase) > _dot(cat, unrelated)

    async with aiohttp.ClientSession() as http:

        async def no_sessions() -> bool:
            loads = [await get_json(http, f"http://{a}/status") for a in three_nodes.addresses]
            return all(s["node"]["load"]["hop"]["kv_sessions"] == 0 for s in loads)

        await until(no_sessions, "every node's caches to hold no session", 30.0)
