"""Ollama's routes on a real aiohttp server over a real socket, in front of the real inference
service running a tiny random Llama in this process: the official `ollama` client streaming
and not, the model routes, errors in Ollama's shape behind the same token check, and a
request with nothing to generate."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import ollama
import pytest

from harness.api_server import MODEL, TOKEN, Served, policy, post, serve
from swarm.config import RuntimeConfig

PROMPT = [{"role": "user", "content": "w5 w6 w7"}]
GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture
async def served(tiny_runtime: RuntimeConfig) -> AsyncIterator[Served]:
    async with serve(tiny_runtime, policy()) as s:
        yield s


def _client(served: Served) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=served.url, headers={"Authorization": f"Bearer {TOKEN}"})


async def test_the_ollama_client_chats_and_generates(served: Served) -> None:
    async with _client(served) as client:
        whole = await client.chat(model=MODEL, messages=PROMPT, options=GREEDY)
        assert whole.done and whole.done_reason in ("stop", "length") and whole.model == MODEL
        assert whole.message.role == "assistant" and whole.eval_count is not None
        assert 0 < whole.eval_count <= 8 and whole.prompt_eval_count
        assert whole.total_duration and whole.load_duration == 0
        assert whole.prompt_eval_duration is not None and whole.eval_duration is not None
        assert whole.prompt_eval_duration + whole.eval_duration <= whole.total_duration

        parts = [p async for p in await client.chat(MODEL, PROMPT, options=GREEDY, stream=True)]
        assert all(not p.done for p in parts[:-1]) and parts[-1].done
        assert "".join(p.message.content or "" for p in parts) == whole.message.content
        assert parts[-1].eval_count == whole.eval_count  # greedy: the same answer either way

        generated = await client.generate(MODEL, "w5 w6 w7", raw=True, options=GREEDY)
        assert generated.done and generated.response is not None and generated.eval_count
        streamed = [
            p async for p in await client.generate(MODEL, "w9", options=GREEDY, stream=True)
        ]
        assert streamed[-1].done and streamed[-1].done_reason in ("stop", "length")

        assert [m.model for m in (await client.list()).models] == [f"{MODEL}:latest"]
        shown = await client.show(f"{MODEL}:latest")
        assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == 256
        assert shown.details is not None and shown.details.family == "llama"
        assert shown.details.format == "safetensors" and shown.details.quantization_level == "F32"
        assert [m.model for m in (await client.ps()).models] == [f"{MODEL}:latest"]
        assert served.api.recent.snapshot()[0].endpoint == "ollama_generate"

        # the client's own tool from a Python function is taken (the tiny model answers text;
        # the prompt now describes the tool, so the text differs)
        offered = await client.chat(MODEL, PROMPT, tools=[get_weather], options=GREEDY)
        assert offered.done and offered.message.content and not offered.message.tool_calls
        assert offered.prompt_eval_count and offered.prompt_eval_count > whole.prompt_eval_count


def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
      city: The city's name
    """
    return f"sunny in {city}"


async def test_logprobs(served: Served) -> None:
    """(format's grammar needs a byte-level vocabulary: tests/test_ollama_e2e.py asks the
    real model for JSON)"""
    async with _client(served) as client:
        answer = await client.chat(MODEL, PROMPT, options=GREEDY, logprobs=True, top_logprobs=2)
        assert answer.logprobs is not None and answer.eval_count == len(answer.logprobs)
        assert all(len(lp.top_logprobs or ()) == 2 for lp in answer.logprobs)
        parts = [
            p
            async for p in await client.generate(
                MODEL, "w5", options=GREEDY, logprobs=True, stream=True
            )
        ]
        streamed = [lp for p in parts for lp in p.logprobs or ()]  # each with its own token
        assert len(streamed) == parts[-1].eval_count and all(
            lp.top_logprobs == [] for lp in streamed
        )


async def _call(
    served: Served, method: str, path: str, body: dict[str, Any] | None, token: str | None = TOKEN
) -> tuple[int, dict[str, Any]]:
    data = post(json.dumps(body).encode() if body is not None else b"", token)
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{served.url}{path}", **data) as r,
    ):
        return r.status, await r.json()


@pytest.mark.parametrize(
    ("method", "path", "body", "token", "status", "fragment"),
    [
        ("GET", "/api/tags", None, None, 401, "Bearer"),
        ("GET", "/api/version", None, "wrong", 401, "wrong"),
        ("POST", "/api/chat", {"model": "llama3", "messages": PROMPT}, TOKEN, 404, "tiny:latest"),
        ("POST", "/api/show", {"model": "llama3"}, TOKEN, 404, "not found"),
        ("POST", "/api/pull", {"model": MODEL}, TOKEN, 404, "/api/pull is not"),
        ("GET", "/api/chat", None, TOKEN, 405, "GET"),
        (
            "POST",
            "/api/generate",
            {"model": MODEL, "prompt": "w5", "options": {"mirostat": 2}},
            TOKEN,
            400,
            "options.mirostat",
        ),
        (
            "POST",
            "/api/chat",
            {"model": MODEL, "messages": [PROMPT[0]] * 200},
            TOKEN,
            400,
            "context",
        ),
    ],
    ids=[
        "no token",
        "wrong token",
        "unknown model",
        "show unknown",
        "pull",
        "a route's other method",
        "mirostat",
        "too long",
    ],
)
async def test_errors_take_ollamas_shape(
    served: Served,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    token: str | None,
    status: int,
    fragment: str,
) -> None:
    got, answer = await _call(served, method, path, body, token)
    assert got == status and set(answer) == {"error"}
    assert fragment in answer["error"]


async def test_nothing_to_generate_answers_at_once(served: Served) -> None:
    status, loaded = await _call(served, "POST", "/api/generate", {"model": MODEL})
    assert status == 200 and loaded["done"] and loaded["done_reason"] == "load"
    status, gone = await _call(
        served, "POST", "/api/chat", {"model": MODEL, "messages": [], "keep_alive": 0}
    )
    assert status == 200 and gone["done_reason"] == "unload" and gone["message"]["content"] == ""
    status, version = await _call(served, "GET", "/api/version", None)
    assert status == 200 and set(version) == {"version"}
    assert served.api.recent.snapshot() == ()  # nothing ran
