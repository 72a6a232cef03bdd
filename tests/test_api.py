"""The HTTP API on a real aiohttp server over a real socket, in front of the real inference
service running a tiny random Llama in this process: the official `openai` client, every
4xx path, the token, the body limit, the concurrency limit, a client that goes away, metrics
and the dashboard page (its speculation counts rendered in headless Chromium)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from harness.api_server import (
    CHAT,
    MODEL,
    TOKEN,
    Served,
    openai_client,
    policy,
    post,
    serve,
)
from harness.browser import Browser, chromium
from harness.polling import until
from swarm.config import RuntimeConfig
from swarm.inference.service import InferenceService


@pytest.fixture
async def served(tiny_runtime: RuntimeConfig) -> AsyncIterator[Served]:
    async with serve(tiny_runtime, policy()) as s:
        yield s


async def test_the_openai_client_streams_and_not(served: Served) -> None:
    client = openai_client(served)
    models = await client.models.list()
    one = await client.models.retrieve(models.data[0].id)
    assert one.id == models.data[0].id
    assert [m.id for m in models.data] == [MODEL]

    whole = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "w5 w6 w7"}],
        max_tokens=8,
        temperature=0,
    )
    text = whole.choices[0].message.content or ""
    assert whole.usage is not None and whole.usage.prompt_tokens > 0
    assert 0 < whole.usage.completion_tokens <= 8
    assert whole.choices[0].finish_reason in ("stop", "length")

    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "w5 w6 w7"}],
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    parts, usage = [], None
    async for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        usage = chunk.usage or usage
    assert "".join(parts) == text  # greedy: the same answer either way
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens

    completion = await client.completions.create(
        model=MODEL, prompt="w9 w10", max_tokens=5, temperature=0.7, top_p=0.9, seed=3
    )
    assert completion.usage is not None and completion.usage.completion_tokens <= 5
    streamed = await client.completions.create(
        model=MODEL, prompt="w9 w10", max_tokens=5, stream=True, extra_body={"top_k": 5}
    )
    assert [c.object async for c in streamed][-1] == "text_completion"
    await client.close()


async def test_the_ollama_and_openai_routes_run_one_generation_path(served: Served) -> None:
    """The same greedy text from /api/chat (NDJSON, Ollama's shape) and /v1/chat/completions
    (streamed and not), each answer recorded under its own endpoint."""
    client = openai_client(served)
    whole = await client.chat.completions.create(
        model=MODEL, messages=CHAT["messages"], max_tokens=6, temperature=0
    )
    stream = await client.chat.completions.create(
        model=MODEL, messages=CHAT["messages"], max_tokens=6, temperature=0, stream=True
    )
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    await client.close()
    body = {**CHAT, "options": {"temperature": 0, "num_predict": 6}}
    del body["temperature"]
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{served.url}/api/chat", **post(json.dumps(body).encode())) as r,
    ):
        assert r.status == 200 and r.content_type == "application/x-ndjson"
        lines = [json.loads(line) for line in (await r.text()).splitlines()]
    assert streamed == whole.choices[0].message.content
    assert "".join(line["message"]["content"] for line in lines) == streamed
    assert whole.usage is not None and lines[-1]["done"]
    assert lines[-1]["eval_count"] == whole.usage.completion_tokens
    endpoints = [r.endpoint for r in served.api.recent.snapshot()]
    assert endpoints == ["ollama_chat", "chat", "chat"]  # newest first


LONG_PROMPT = json.dumps({**CHAT, "messages": [{"role": "user", "content": "w5 " * 400}]})
AUTHED = {"headers": {"Authorization": f"Bearer {TOKEN}"}}  # a GET with the token
BAD_REQUESTS = [
    # (what, path, request kwargs, status, fragment of the message)
    ("malformed JSON", "chat/completions", post(b"{not json"), 400, "not valid JSON"),
    ("not an object", "chat/completions", post(b"[1, 2]"), 400, "JSON object"),
    ("messages a string", "chat/completions", post(b'{"messages": "hi"}'), 400, "messages"),
    (
        "max_tokens a string",
        "chat/completions",
        post(json.dumps({**CHAT, "max_tokens": "ten"}).encode()),
        400,
        "max_tokens must be an integer",
    ),
    (
        "temperature out of range",
        "chat/completions",
        post(json.dumps({**CHAT, "temperature": -1}).encode()),
        400,
        "temperature",
    ),
    (
        "stream not a boolean",
        "chat/completions",
        post(json.dumps({**CHAT, "stream": "yes"}).encode()),
        400,
        "stream must be true or false",
    ),
    ("n = 2", "chat/completions", post(json.dumps({**CHAT, "n": 2}).encode()), 400, "n = 1"),
    (
        "model a number",
        "chat/completions",
        post(json.dumps({**CHAT, "model": 5}).encode()),
        400,
        "model must be a string",
    ),
    (
        "unknown model",
        "chat/completions",
        post(json.dumps({**CHAT, "model": "gpt-9"}).encode()),
        404,
        "'gpt-9' does not exist",
    ),
    ("prompt too long", "chat/completions", post(LONG_PROMPT.encode()), 400, "context of 256"),
    (
        "empty prompt",
        "completions",
        post(json.dumps({"prompt": ""}).encode()),
        400,
        "prompt must be a non-empty string",
    ),
    ("body too large", "chat/completions", post(b" " * (65 * 1024)), 413, "limit of 65536"),
    ("no token", "chat/completions", post(json.dumps(CHAT).encode(), None), 401, "Bearer"),
    ("wrong token", "chat/completions", post(json.dumps(CHAT).encode(), "nope"), 401, "wrong"),
    ("no token on status", "../status", {}, 401, "Bearer"),
    ("an unknown model by id", "models/gpt-9", AUTHED, 404, "'gpt-9' does not exist"),
    ("embeddings without input", "embeddings", post(b"{}"), 400, "input must be a string"),
    ("openai's responses", "responses", post(b"{}"), 404, "Responses API is not served"),
    ("no such route", "nowhere", {}, 404, "this node has no such route"),
    ("another method", "models", post(b"{}"), 405, "it takes GET"),
    ("no token on metrics", "../metrics", {}, 401, "Bearer"),
]


@pytest.mark.parametrize(
    ("path", "kwargs", "status", "fragment"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
async def test_bad_requests_get_clear_openai_errors(
    served: Served, path: str, kwargs: dict[str, Any], status: int, fragment: str
) -> None:
    method = "POST" if "data" in kwargs else "GET"
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{served.url}/v1/{path}", **kwargs) as r,
    ):
        assert r.status == status, await r.text()
        assert r.content_type == "application/json"
        error = (await r.json())["error"]
        if status == 401:
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert fragment in error["message"]
    assert error["type"] and "param" in error
    assert served.api.guard.in_flight == 0
    assert served.kv_sessions() == 0  # nothing started


async def test_the_openai_client_sees_a_wrong_token_as_authentication_error(
    served: Served,
) -> None:
    async with openai_client(served, "nope") as client:
        with pytest.raises(openai.AuthenticationError, match="wrong"):
            await client.models.list()


async def test_a_node_at_its_limit_answers_429_with_retry_after(
    tiny_runtime: RuntimeConfig,
) -> None:
    async with serve(tiny_runtime, policy(max_concurrent_requests=1)) as served:
        body = json.dumps({**CHAT, "max_tokens": 200, "stream": True}).encode()
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{served.url}/v1/chat/completions", **post(body)) as first:
                assert first.status == 200
                await first.content.readline()  # the stream has started: the slot is taken
                async with http.post(f"{served.url}/v1/chat/completions", **post(body)) as refused:
                    assert refused.status == 429
                    assert refused.headers["Retry-After"] == "3"
                    error = (await refused.json())["error"]
                assert error["type"] == "rate_limit_error" and "1 requests" in error["message"]
            await until(
                lambda: served.api.guard.in_flight == 0, "the slot freeing", 10.0, every_s=0.02
            )
            small = json.dumps({**CHAT, "max_tokens": 2}).encode()
            async with http.post(f"{served.url}/v1/chat/completions", **post(small)) as again:
                assert again.status == 200


async def test_a_client_that_leaves_while_queued_never_starts_a_generation(
    tiny_runtime: RuntimeConfig,
) -> None:
    async with serve(tiny_runtime, policy(max_concurrent_requests=1, queue_size=2)) as served:
        guard = served.api.guard
        body = json.dumps({**CHAT, "max_tokens": 200, "stream": True}).encode()
        async with aiohttp.ClientSession() as http:

            async def ask() -> None:
                async with http.post(f"{served.url}/v1/chat/completions", **post(body)) as r:
                    await r.read()

            async with http.post(f"{served.url}/v1/chat/completions", **post(body)) as first:
                await first.content.readline()  # the stream has started: the slot is taken
                waiting = asyncio.create_task(ask())
                await until(lambda: guard.queued == 1, "the second queued", 10.0, every_s=0.02)
                waiting.cancel()  # drops its connection
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
                await until(lambda: guard.queued == 0, "its room freed", 10.0, every_s=0.02)
                await first.read()
        await until(lambda: guard.in_flight == 0, "the slot freeing", 10.0, every_s=0.02)
        assert [r.outcome for r in served.api.recent.snapshot()] == ["length"]


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_that_goes_away_frees_its_session(served: Served, stream: bool) -> None:
    body = json.dumps({**CHAT, "max_tokens": 240, "stream": stream}).encode()
    lines = 0

    async def ask() -> None:
        nonlocal lines
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{served.url}/v1/chat/completions", **post(body)) as r,
        ):
            async for _ in r.content:
                lines += 1

    asking = asyncio.create_task(ask())
    # mid-answer: the session holds caches (and, streaming, some chunks have arrived)
    await until(
        lambda: served.kv_sessions() == 1 and (lines >= 3 or not stream),
        "the answer under way",
        10.0,
        every_s=0.02,
    )
    assert served.api.guard.in_flight == 1
    asking.cancel()  # drops the connection
    with contextlib.suppress(asyncio.CancelledError):
        await asking
    await until(
        lambda: served.kv_sessions() == 0 and served.api.guard.in_flight == 0,
        "the session freeing",
        10.0,
        every_s=0.02,
    )
    record = served.api.recent.snapshot()[0]
    assert record.outcome == "disconnected"
    assert record.completion_tokens < 240


async def test_status_metrics_and_dashboard(served: Served) -> None:
    client = openai_client(served)
    await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "w5"}], max_tokens=4
    )
    await client.close()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=auth) as http:
        async with http.get(f"{served.url}/status") as r:
            status = await r.json()
        async with http.get(f"{served.url}/metrics") as r:
            assert r.status == 200 and r.content_type == "text/plain"
            metrics = await r.text()
        async with aiohttp.ClientSession() as anonymous, anonymous.get(f"{served.url}/") as r:
            assert r.status == 200 and r.content_type == "text/html"
            page = await r.text()
    recent = status["recent_requests"][0]
    assert recent["endpoint"] == "chat" and 0 < recent["completion_tokens"] <= 4
    assert status["api"] == {
        "in_flight": 0,
        "max_concurrent_requests": 4,
        "token_required": True,
        "queued": 0,
        "queue_size": 0,
    }
    completion = _sample(metrics, 'swarm_tokens_total{kind="completion"}')
    assert completion == recent["completion_tokens"]
    assert _sample(metrics, 'swarm_http_requests_total{route="chat",status="200"}') == 1
    assert _sample(metrics, "swarm_time_to_first_token_seconds_count") == 1
    assert _sample(metrics, "swarm_kv_sessions") == 0
    assert _sample(metrics, "process_resident_memory_bytes") > 0
    assert '<table id="members">' in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing from elsewhere


def _drafted(served: Served) -> None:
    """Verify steps as the head counts them: one of the draft model's (3 of 4 kept), one of
    the lookup's (none of 2 kept)."""
    assert isinstance(served.api.backend, InferenceService)
    counts = served.api.backend.head.drafts
    counts.add(4, 3, "model")
    counts.add(2, 0, "lookup")


async def test_status_and_metrics_carry_the_speculation_counts(served: Served) -> None:
    """What the dashboard shows of speculation comes from /status (and /metrics says the
    same): drafted and accepted tokens, verify steps and the mean accepted length."""
    _drafted(served)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=auth) as http:
        async with http.get(f"{served.url}/status") as r:
            speculation = (await r.json())["speculation"]
        async with http.get(f"{served.url}/metrics") as r:
            metrics = await r.text()
    assert speculation == {
        "verify_steps": 2,
        "drafted": 6,
        "accepted": 3,
        "mean_accepted": 1.5,
        "unverified": 0,
        "draft_model": "",
        "model_drafted": 4,
        "model_accepted": 3,
    }
    assert _sample(metrics, "swarm_speculative_drafted_tokens_total") == 6
    assert _sample(metrics, "swarm_speculative_accepted_tokens_total") == 3
    assert _sample(metrics, "swarm_speculative_mean_accepted") == 1.5


_CARDS = (
    "[...document.querySelectorAll('#speculation .card')]"
    ".map(c => c.querySelector('.k').textContent + ': ' + c.querySelector('.v').textContent)"
)


async def test_the_dashboard_shows_the_acceptance_of_drafts(served: Served, tmp_path: Path) -> None:
    browser = chromium()
    if browser is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium; .ci/run does)")
    _drafted(served)
    async with Browser(browser, tmp_path / "profile") as page:
        await page.open(f"{served.url}/#token={TOKEN}")
        cards = await page.wait_for(f"{_CARDS}.length && {_CARDS}")
        assert cards == [
            "drafts accepted / drafted: 3 / 6 (50%)",
            "mean accepted per verify step: 1.50",
            "verify steps: 2",
            "verify steps dropped unverified: 0",
        ]
        # with a draft model, its own share too (rendered and read in one evaluation: the
        # page's next poll renders the node's own numbers again)
        model = {"draft_model": "tiny-draft", "model_drafted": 4, "model_accepted": 3}
        with_model = await page.evaluate(
            f"renderSpeculation({{speculation: {json.dumps(model)}}}), {_CARDS}"
        )
        assert with_model[-1] == "draft model tiny-draft: accepted / drafted: 3 / 4 (75%)"
        # the prompt cache's share of the recent requests' prompt tokens
        records = [{"prompt_tokens": 300, "cached_tokens": 256}, {"prompt_tokens": 100}]
        assert await page.evaluate(f"cachedShare({json.dumps(records)})") == "256 / 400 (64%)"
        assert await page.evaluate("cachedShare([]) === dash")
        load = await page.evaluate(
            "[...document.querySelectorAll('#load .card .k')].map(e => e.textContent)"
        )
        assert "prompt chunks kept" in load


def _sample(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in the metrics")


async def test_health_needs_no_token_and_says_when_the_node_cannotserve(served: Served) -> None:
    async with aiohttp.ClientSession() as anonymous:
        async with anonymous.get(f"{served.url}/health") as r:
            assert r.status == 200 and await r.json() == {"status": "ok"}
        async with anonymous.get(f"{served.url}/status") as r:
            assert r.status == 401  # the rest still needs the token
        assert isinstance(served.api.backend, InferenceService)
        served.api.backend.accepting = False  # as when the node leaves
        async with anonymous.get(f"{served.url}/health") as r:
            body = await r.json()
    assert r.status == 503 and body["status"] == "unavailable"
    assert body["reason"] == "this node is leaving the swarm"


async def test_the_chat_page_needs_no_token_and_nothing_from_elsewhere(served: Served) -> None:
    """The page holds no data (its script sends the token from the fragment), and it loads
    nothing from another origin: it works offline."""
    async with aiohttp.ClientSession() as anonymous, anonymous.get(f"{served.url}/chat") as r:
        assert r.status == 200 and r.content_type == "text/html"
        page = await r.text()
    assert 'id="composer"' in page and "/v1/chat/completions" in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert not re.search(r"""fetch\(["'`]https?:""", page)


@pytest.mark.parametrize(
    ("method", "path", "allowed", "status", "fragment"),
    [
        ("POST", "/v1/responses", (), 404, "Responses API is not served yet by swarm"),
        ("POST", "/v1/responses/", (), 404, "Responses API is not served yet"),
        ("GET", "/v2/chat", (), 404, "GET /v2/chat: this node has no such route"),
        ("DELETE", "/v1/models", ("GET", "HEAD"), 405, "it takes GET"),
    ],
)
def test_unknown_routes_say_what_was_asked_and_what_is_served(
    method: str, path: str, allowed: tuple[str, ...], status: int, fragment: str
) -> None:
    from swarm.api.unknown_routes import unknown_route

    error = unknown_route(method, path, allowed)
    assert error.status == status and fragment in error.message
    if status == 404:
        assert "/v1/chat/completions" in error.message
