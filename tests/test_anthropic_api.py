"""Anthropic's /v1/messages on a real aiohttp server over a real socket, in front of the real
inference service running a tiny random Llama in this process: the official `anthropic`
client streaming and not, with the token as x-api-key or as a Bearer header, and errors in
Anthropic's shape, none of which starts anything."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import pytest

from harness.api_server import MODEL, TOKEN, Served, policy, serve
from swarm.config import RuntimeConfig

PROMPT: Any = [{"role": "user", "content": "w5 w6 w7"}]
# The client's own arguments no longer have the sampling fields; the API still takes them.
GREEDY = {"temperature": 0}


@pytest.fixture
async def served(tiny_runtime: RuntimeConfig) -> AsyncIterator[Served]:
    async with serve(tiny_runtime, policy()) as s:
        yield s


async def test_the_anthropic_client_streamed_and_whole(served: Served) -> None:
    async with anthropic.AsyncAnthropic(
        base_url=served.url, api_key=TOKEN, max_retries=0
    ) as client:
        whole = await client.messages.create(
            model=MODEL, max_tokens=8, messages=PROMPT, extra_body=GREEDY
        )
        async with client.messages.stream(
            model=MODEL, max_tokens=8, messages=PROMPT, extra_body=GREEDY
        ) as stream:
            texts = [text async for text in stream.text_stream]
            streamed = await stream.get_final_message()
    assert whole.id.startswith("msg_") and whole.model == MODEL and whole.role == "assistant"
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.stop_sequence is None
    (block,) = whole.content
    assert block.type == "text" and "".join(texts) == block.text  # greedy: the same text
    assert [b.to_dict() for b in streamed.content] == [b.to_dict() for b in whole.content]
    assert streamed.stop_reason == whole.stop_reason
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    assert 0 < whole.usage.output_tokens <= 8 and whole.usage.input_tokens > 0
    assert whole.usage.cache_read_input_tokens == 0
    assert {r.endpoint for r in served.api.recent.snapshot()} == {"anthropic_messages"}


async def test_a_bearer_token_works_and_x_api_key_works_on_every_route(served: Served) -> None:
    async with anthropic.AsyncAnthropic(
        base_url=served.url, auth_token=TOKEN, max_retries=0
    ) as client:
        answer = await client.messages.create(model=MODEL, max_tokens=2, messages=PROMPT)
    assert answer.usage.output_tokens <= 2
    async with (
        aiohttp.ClientSession(headers={"x-api-key": TOKEN}) as http,
        http.get(f"{served.url}/v1/models") as r,
    ):
        assert r.status == 200 and (await r.json())["data"][0]["id"] == MODEL


def _headers(key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "anthropic-version": "2023-06-01"}
    return headers if key is None else {**headers, "x-api-key": key}


BODY = {"model": MODEL, "max_tokens": 4, "messages": PROMPT}


@pytest.mark.parametrize(
    ("method", "path", "body", "key", "status", "kind", "fragment"),
    [
        ("POST", "/v1/messages", BODY, None, 401, "authentication_error", "x-api-key"),
        ("POST", "/v1/messages", BODY, "wrong", 401, "authentication_error", "wrong"),
        ("POST", "/v1/messages", {**BODY, "model": "claude"}, TOKEN, 404, "not_found_error", MODEL),
        (
            "POST",
            "/v1/messages",
            {**BODY, "thinking": {"type": "enabled", "budget_tokens": 1024}},
            TOKEN,
            400,
            "invalid_request_error",
            "thinking",
        ),
        (
            "POST",
            "/v1/messages",
            {**BODY, "max_tokens": None},
            TOKEN,
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        ("POST", "/v1/messages", "[1]", TOKEN, 400, "invalid_request_error", "JSON object"),
        (
            "POST",
            "/v1/messages",
            {**BODY, "messages": PROMPT * 200},
            TOKEN,
            400,
            "invalid_request_error",
            "context",
        ),
        ("GET", "/v1/messages", None, TOKEN, 405, "invalid_request_error", "it takes POST"),
        ("POST", "/v1/messages/count_tokens", BODY, TOKEN, 404, "not_found_error", "counting"),
    ],
    ids=[
        "no key",
        "wrong key",
        "unknown model",
        "thinking",
        "no max_tokens",
        "not an object",
        "too long",
        "another method",
        "count_tokens",
    ],
)
async def test_errors_take_anthropics_shape(
    served: Served,
    method: str,
    path: str,
    body: Any,
    key: str | None,
    status: int,
    kind: str,
    fragment: str,
) -> None:
    data = body if isinstance(body, str) else json.dumps(body) if body is not None else None
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{served.url}{path}", data=data, headers=_headers(key)) as r,
    ):
        assert r.status == status, await r.text()
        answer = await r.json()
    assert answer["type"] == "error" and answer["error"]["type"] == kind
    assert fragment in answer["error"]["message"]
    assert served.api.guard.in_flight == 0 and served.kv_sessions() == 0  # nothing started


async def test_the_client_raises_its_own_errors(served: Served) -> None:
    async with anthropic.AsyncAnthropic(
        base_url=served.url, api_key="wrong", max_retries=0
    ) as client:
        with pytest.raises(anthropic.AuthenticationError) as denied:
            await client.messages.create(model=MODEL, max_tokens=2, messages=PROMPT)
    assert denied.value.status_code == 401
    async with anthropic.AsyncAnthropic(
        base_url=served.url, api_key=TOKEN, max_retries=0
    ) as client:
        with pytest.raises(anthropic.NotFoundError) as unknown:
            await client.messages.create(model="claude-x", max_tokens=2, messages=PROMPT)
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(
                model=MODEL, max_tokens=2, messages=PROMPT, extra_body={"mcp_servers": []}
            )
    assert MODEL in unknown.value.message and "mcp_servers" in refused.value.message
