"""Ollama's API on a real node process (the real model, an API token configured), driven by
the official `ollama` client: chat streamed and not, generate, the model routes, JSON output,
greedy and seeded text equal to the OpenAI route's for the same settings, an option swarm
does not have refused by name, and docs/api.md's examples as written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import ollama
import openai
import pytest

from harness.cluster import Cluster, node_behind_token
from harness.doc_examples import run_section
from swarm.config import RuntimeConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOKEN = "ollama-e2e-token-5c1d"
MODEL = "smollm2-135m-instruct"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 16}


@pytest.fixture(scope="module")
def node(
    smol_runtime: RuntimeConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    yield from node_behind_token(smol_runtime, tmp_path_factory, TOKEN)


def _ollama(node: Cluster) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=f"http://{node.addresses[0]}", headers=AUTH)


def _openai(node: Cluster) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"http://{node.addresses[0]}/v1", api_key=TOKEN, max_retries=0
    )


async def test_chat_streamed_and_whole(node: Cluster) -> None:
    async with _ollama(node) as client:
        parts = [p async for p in await client.chat(MODEL, CAPITAL, options=GREEDY, stream=True)]
        whole = await client.chat(MODEL, CAPITAL, options=GREEDY)
    streamed = "".join(p.message.content or "" for p in parts)
    assert "Paris" in streamed and whole.message.content == streamed
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    last = parts[-1]
    assert last.done_reason in ("stop", "length") and last.model == MODEL
    assert last.eval_count == whole.eval_count and 0 < (last.eval_count or 0) <= 16
    assert last.prompt_eval_count == whole.prompt_eval_count and last.prompt_eval_count
    for answer in (last, whole):
        assert answer.total_duration and answer.prompt_eval_duration and answer.eval_duration
        assert answer.prompt_eval_duration + answer.eval_duration <= answer.total_duration


async def test_generate_and_the_model_routes(node: Cluster) -> None:
    async with _ollama(node) as client:
        question = CAPITAL[0]["content"]
        answer = await client.generate(MODEL, question, options=GREEDY)
        chatted = await client.chat(MODEL, CAPITAL, options=GREEDY)
        listed = (await client.list()).models
        shown = await client.show(MODEL)
        running = (await client.ps()).models
    # a prompt is the user's turn of the chat template
    assert "Paris" in (answer.response or "") and answer.response == chatted.message.content
    assert [m.model for m in listed] == [f"{MODEL}:latest"] == [m.model for m in running]
    details = listed[0].details
    assert details is not None and details.family == "llama" and details.format == "gguf"
    assert details.quantization_level == "Q4_1" and details.parameter_size == "134.5M"
    assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == 8192
    assert shown.modelinfo["llama.block_count"] == 30 and "im_start" in (shown.template or "")
    assert running[0].context_length == 8192
    async with (
        aiohttp.ClientSession(headers=AUTH) as http,
        http.get(f"http://{node.addresses[0]}/api/version") as r,
    ):
        assert r.status == 200 and set(await r.json()) == {"version"}


PLACE = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"],
    "additionalProperties": False,
}


async def test_json_format_and_a_schema(node: Cluster) -> None:
    ask = [{"role": "user", "content": "Answer in JSON: what is the capital of France?"}]
    options = {"temperature": 0, "num_predict": 48}
    async with _ollama(node) as client:
        free = await client.chat(MODEL, ask, format="json", options=options)
        shaped = await client.chat(MODEL, ask, format=PLACE, options=options)
    assert free.done_reason == "stop" and isinstance(json.loads(free.message.content or ""), dict)
    place = json.loads(shaped.message.content or "")
    jsonschema.validate(place, PLACE)
    assert place["city"] == "Paris"


SETTINGS = [
    # (what, Ollama's options, the OpenAI route's fields for the same settings)
    ("greedy", {"temperature": 0, "num_predict": 24}, {"temperature": 0, "max_tokens": 24}),
    (
        "seeded, Ollama's defaults",  # temperature 0.8, top_k 40, top_p 0.9 where none is set
        {"seed": 42, "num_predict": 24},
        {"temperature": 0.8, "top_p": 0.9, "seed": 42, "max_tokens": 24, "top_k": 40},
    ),
    (
        "seeded, every sampler",
        {"seed": 7, "num_predict": 24, "temperature": 1.2, "top_k": 0, "min_p": 0.05},
        {"temperature": 1.2, "top_p": 0.9, "min_p": 0.05, "seed": 7, "max_tokens": 24},
    ),
]


@pytest.mark.parametrize(("what", "options", "fields"), SETTINGS, ids=[s[0] for s in SETTINGS])
async def test_the_same_text_as_the_openai_route(
    node: Cluster, what: str, options: dict[str, Any], fields: dict[str, Any]
) -> None:
    question = [{"role": "user", "content": "Tell me about the sea."}]
    openai_fields = {k: v for k, v in fields.items() if k not in ("top_k", "min_p")}
    extra = {k: v for k, v in fields.items() if k in ("top_k", "min_p")}
    async with _ollama(node) as client, _openai(node) as oa:
        mine = await client.chat(MODEL, question, options=options)
        theirs = await oa.chat.completions.create(
            model=MODEL, messages=question, extra_body=extra, **openai_fields
        )
        raw = await client.generate(MODEL, "The sea is", raw=True, options=options)
        completed = await oa.completions.create(
            model=MODEL, prompt="The sea is", extra_body=extra, **openai_fields
        )
    assert mine.message.content == theirs.choices[0].message.content
    assert mine.eval_count == (theirs.usage.completion_tokens if theirs.usage else None)
    assert raw.response == completed.choices[0].text and raw.response


async def test_what_swarm_does_not_do_is_refused_by_name(node: Cluster) -> None:
    async with _ollama(node) as client:
        with pytest.raises(ollama.ResponseError) as refused:
            await client.chat(MODEL, CAPITAL, options={"mirostat": 2})
        assert refused.value.status_code == 400 and "options.mirostat" in refused.value.error
        with pytest.raises(ollama.ResponseError) as unknown:
            await client.chat("llama3.2", CAPITAL)
        assert unknown.value.status_code == 404 and f"{MODEL}:latest" in unknown.value.error
    async with ollama.AsyncClient(host=f"http://{node.addresses[0]}") as anonymous:
        with pytest.raises(ollama.ResponseError) as denied:
            await anonymous.list()
        assert denied.value.status_code == 401


def test_the_docs_examples_run_as_written(node: Cluster, tmp_path: Path) -> None:
    """Each example, its address replaced by the node's, run in a folder with its token."""
    ran = run_section("docs/api.md", "Ollama's API", node.addresses[0], TOKEN, tmp_path)
    lines = [json.loads(line) for line in ran.shell.splitlines()]  # NDJSON: Ollama streams
    assert lines[-1]["done"] and "".join(line["message"]["content"] for line in lines).strip()
    assert len(ran.python.split()) > 3, ran.python
