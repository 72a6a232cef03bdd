"""Hostile request bodies and headers against the real API in this process (harness/api_server.py):
each is a 4xx with a message, never a 500, and the server answers normally afterwards."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.api_server import TOKEN, Served, policy, serve
from harness.factories import write_tiny_llama
from swarm.config import RuntimeConfig

AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
PROMPT = {"prompt": "w5 w6", "max_tokens": 2, "temperature": 0}


@pytest.fixture
async def served(tiny_runtime: RuntimeConfig) -> AsyncIterator[Served]:
    async with serve(tiny_runtime, policy(max_body_bytes=1024 * 1024)) as s:
        yield s


async def _post(served: Served, raw: bytes, path: str = "completions") -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{served.url}/v1/{path}", data=raw, headers=AUTH) as r,
    ):
        return r.status, await r.text()


HOSTILE = [
    ("5000-digit integer", b'{"prompt": "w5", "max_tokens": ' + b"9" * 5000 + b"}", "not valid"),
    ("100k-deep JSON", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests too"),
    ("seed of 2^64", json.dumps({**PROMPT, "seed": 2**64}).encode(), "seed must be in"),
    ("lone surrogate", b'{"prompt": "w5 \\ud800 w6", "max_tokens": 2}', "lone UTF-16"),
    ("lone surrogate key", b'{"prompt": "w5", "\\udfff": 1}', "lone UTF-16"),
    ("long stop string", json.dumps({**PROMPT, "stop": "x" * 257}).encode(), "256 characters"),
    ("not UTF-8", b'{"prompt": "\xff\xfe"}', "not valid JSON"),
    ("NaN", b'{"prompt": "w5", "temperature": NaN}', "temperature"),
]


@pytest.mark.parametrize(("raw", "fragment"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
async def test_hostile_bodies_are_400s_with_a_message(
    served: Served, raw: bytes, fragment: str
) -> None:
    status, text = await _post(served, raw)
    assert status == 400, text
    assert fragment in json.loads(text)["error"]["message"]
    assert (await _post(served, json.dumps(PROMPT).encode()))[0] == 200


async def test_an_authorization_header_that_is_not_utf8_is_a_401(served: Served) -> None:
    host, _, port = served.url.removeprefix("http://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"GET /status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\x80\r\n"
        b"Connection: close\r\n\r\n"
    )
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    [
        "prompt",
        "messages",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "n",
        "logit_bias",
        "logprobs",
        "stream",
        "stream_options",
        "min_p",
        "presence_penalty",
    ]
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=st.dictionaries(FIELDS, JSON_VALUES, max_size=5), chat=st.booleans())
async def test_random_requests_never_get_a_500(
    served: Served, body: dict[str, Any], chat: bool
) -> None:
    body = {**body, "max_tokens": 2} if "max_tokens" not in body else body
    status, text = await _post(
        served, json.dumps(body).encode(), "chat/completions" if chat else "completions"
    )
    assert status < 500, text
    if status >= 400:
        assert json.loads(text)["error"]["message"]


async def test_a_token_outside_the_embedding_is_a_400_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a model file whose embedding has fewer rows than its tokenizer has tokens
    write_tiny_llama(tmp_path / "short", vocab_size=200)
    runtime = RuntimeConfig(model=str(tmp_path / "short"), cache_dir=tmp_path / "cache", threads=1)
    async with serve(runtime, policy()) as served:
        status, text = await _post(served, json.dumps({**PROMPT, "prompt": "w5 w250"}).encode())
        assert status == 400, text
        error = json.loads(text)["error"]
        assert error["param"] == "prompt"
        assert "token 253 ('w250')" in error["message"] and "200 rows" in error["message"]
        assert "bug: the tokenizer made token 253" in caplog.text
        status, text = await _post(served, json.dumps(PROMPT).encode())
        assert status == 200, text
