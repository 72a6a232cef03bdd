"""Every request field is honoured or refused with a 400 naming it, over a real socket in front
of the real inference service: refusals, logprobs, logit_bias, stream usage, max_tokens up to
the context, the model list, and the wait queue before 429."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import torch

from harness.api_server import CHAT, MODEL, Served, openai_client, policy, post, serve
from harness.polling import until
from swarm.config import RuntimeConfig

PROMPT = {"model": MODEL, "prompt": "w5 w6 w7", "temperature": 0}
CONTEXT = 256  # the service's max_prompt_tokens in harness.api_server


@pytest.fixture
async def served(tiny_runtime: RuntimeConfig) -> AsyncIterator[Served]:
    async with serve(tiny_runtime, policy()) as s:
        yield s


async def _ask(served: Served, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{served.url}/v1/{path}", **post(json.dumps(body).encode())) as r,
    ):
        return r.status, await r.json()


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
REFUSED = [
    # (what, path, fields added to the request, the param named, fragment of the message)
    ("unknown field", "chat/completions", {"frobnicate": 1}, "frobnicate", "unknown field"),
    ("functions", "chat/completions", {"functions": [TOOL]}, "functions", "not supported yet"),
    ("tool_choice alone", "chat/completions", {"tool_choice": "auto"}, "tool_choice", "needs"),
    (
        "unknown tool_choice",
        "chat/completions",
        {"tools": [TOOL], "tool_choice": "sometimes"},
        "tool_choice",
        '"none", "auto", "required"',
    ),
    (
        "named tool not offered",
        "chat/completions",
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
        "tool_choice",
        "not in tools",
    ),
    (
        "tool parameters schema",
        "chat/completions",
        {"tools": [{**TOOL, "function": {"name": "f", "parameters": {"type": "foo"}}}]},
        "tools",
        "Invalid type: foo",
    ),
    (
        "tool message without call id",
        "chat/completions",
        {"messages": [*CHAT["messages"], {"role": "tool", "content": "42"}]},
        "messages[1].tool_call_id",
        "needs tool_call_id",
    ),
    (
        "unknown role",
        "chat/completions",
        {"messages": [{"role": "robot", "content": "w5"}]},
        "messages[0].role",
        "must be one of",
    ),
    (
        "invalid json schema",
        "chat/completions",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": {"type": "integer", "minimum": "x"}},
            }
        },
        "response_format",
        "schema is invalid",
    ),
    (
        "unknown format",
        "chat/completions",
        {"response_format": {"type": "xml"}},
        "response_format",
        "json_schema",
    ),
    ("logprobs a number", "chat/completions", {"logprobs": 2}, "logprobs", "true or false"),
    ("top_logprobs alone", "chat/completions", {"top_logprobs": 2}, "top_logprobs", "needs"),
    (
        "top_logprobs 21",
        "chat/completions",
        {"logprobs": True, "top_logprobs": 21},
        "top_logprobs",
        "[0",
    ),
    ("logprobs 6", "completions", {"logprobs": 6}, "logprobs", "logprobs must be in [0"),
    ("suffix", "completions", {"suffix": "w9"}, "suffix", "not supported yet"),
    ("echo", "completions", {"echo": True}, "echo", "not supported yet"),
    ("messages on completions", "completions", {"messages": []}, "messages", "unknown field"),
    ("prompt on chat", "chat/completions", {"prompt": "w5"}, "prompt", "unknown field"),
    ("logit_bias key", "chat/completions", {"logit_bias": {"w5": 1}}, "logit_bias", "token ids"),
    ("logit_bias value", "completions", {"logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
    ("logit_bias id", "completions", {"logit_bias": {"99999": 5}}, "logit_bias", "vocabulary"),
    ("presence_penalty", "chat/completions", {"presence_penalty": 3}, "presence_penalty", "[-2"),
    ("min_p", "completions", {"min_p": 1.5}, "min_p", "min_p must be in"),
    ("speculate", "chat/completions", {"speculate": "no"}, "speculate", "true or false"),
    (
        "stream_options without stream",
        "chat/completions",
        {"stream_options": {"include_usage": True}},
        "stream_options",
        "stream: true",
    ),
    ("too long", "completions", {"max_tokens": CONTEXT}, "max_tokens", "context of 256"),
]


@pytest.mark.parametrize(
    ("path", "fields", "param", "fragment"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
async def test_what_is_not_honoured_is_refused_by_name(
    served: Served, path: str, fields: dict[str, Any], param: str, fragment: str
) -> None:
    base = CHAT if path == "chat/completions" else PROMPT
    status, body = await _ask(served, path, {**base, **fields})
    assert status == 400, body
    assert body["error"]["param"] == param and fragment in body["error"]["message"]
    assert served.api.guard.in_flight == 0 and served.kv_sessions() == 0  # nothing started


async def test_harmless_fields_are_accepted(served: Served) -> None:
    fields = {"response_format": {"type": "text"}, "user": "u1", "logprobs": False, "n": 1}
    status, body = await _ask(served, "chat/completions", {**CHAT, **fields, "max_tokens": 2})
    assert status == 200, body
    status, body = await _ask(served, "completions", {**PROMPT, "echo": False, "max_tokens": 2})
    assert status == 200, body


async def test_logit_bias_forces_a_token_and_bans_the_end(served: Served) -> None:
    forced = 10  # "w7" in the tiny vocabulary
    async with openai_client(served) as client:
        answer = await client.completions.create(
            model=MODEL, prompt="w5 w6", max_tokens=4, temperature=0, logit_bias={str(forced): 100}
        )
    assert answer.choices[0].text == served.local.entry.tokenizer.decode([forced] * 4)

    # max_tokens absent: the answer may run to the context's end, and with the end of text
    # banned it does
    eos = {str(i): -100 for i in served.local.entry.eos_token_ids}
    status, body = await _ask(served, "completions", {**PROMPT, "logit_bias": eos})
    assert status == 200, body
    usage = body["usage"]
    assert body["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == CONTEXT


async def test_include_usage_sends_a_last_chunk_with_only_the_usage(served: Served) -> None:
    async with openai_client(served) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "w5 w6 w7"}],
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    *answer, last = chunks
    assert last.choices == [] and last.usage is not None
    assert all(c.usage is None and len(c.choices) == 1 for c in answer)
    assert answer[-1].choices[0].finish_reason in ("stop", "length")
    assert 0 < last.usage.completion_tokens <= 6
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens


async def test_logprobs_are_the_models_own_in_openais_shapes(
    served: Served, tiny_model: Any
) -> None:
    ask = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "w5 w6 w7"}],
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    async with openai_client(served) as client:
        whole = await client.chat.completions.create(**ask)
        stream = await client.chat.completions.create(**ask, stream=True)
        streamed = [
            lp
            async for chunk in stream
            if chunk.choices and chunk.choices[0].logprobs
            for lp in chunk.choices[0].logprobs.content or []
        ]
        completion = await client.completions.create(
            model=MODEL, prompt="w5 w6", max_tokens=3, temperature=0, logprobs=2
        )
    assert whole.choices[0].logprobs is not None and whole.usage is not None
    content = whole.choices[0].logprobs.content or []
    assert len(content) == whole.usage.completion_tokens
    for lp in content:
        assert 0 < torch.tensor(lp.logprob).exp() <= 1
        tops = [t.logprob for t in lp.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert lp.logprob == pytest.approx(tops[0])  # greedy: the chosen is the likeliest
    assert [(lp.token, lp.logprob) for lp in streamed] == [(lp.token, lp.logprob) for lp in content]

    # the first token's logprob is what the model itself gives after the prompt
    ids = served.local.entry.encode_chat([{"role": "user", "content": "w5 w6 w7"}])
    with torch.no_grad():
        logits = tiny_model(torch.tensor([ids])).logits[0, -1].float()
    expected = torch.log_softmax(logits, dim=-1).max()
    assert content[0].logprob == pytest.approx(float(expected), abs=1e-4)

    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 3
    assert all(len(top) <= 2 for top in logprobs.top_logprobs or [])
    assert logprobs.text_offset == sorted(logprobs.text_offset or [])


async def test_models_lists_the_served_name_its_context_and_coverage(served: Served) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{served.url}/v1/models", headers=post(b"")["headers"]) as r,
    ):
        assert r.status == 200
        (model,) = (await r.json())["data"]
    assert model["id"] == MODEL and model["context_length"] == CONTEXT
    assert model["coverage"]["complete"] is True and model["coverage"]["missing"] == []


async def test_a_full_node_queues_then_refuses_with_retry_after(
    tiny_runtime: RuntimeConfig,
) -> None:
    # the slot's holder streams to the context's end (the end of text banned) unless closed
    eos = {str(i): -100 for i in range(3)}  # the tiny vocabulary's specials
    hold = json.dumps({**PROMPT, "stream": True, "logit_bias": eos}).encode()
    small = {**PROMPT, "max_tokens": 2}
    one_slot = policy(max_concurrent_requests=1, queue_size=1, queue_timeout_s=30.0)
    async with serve(tiny_runtime, one_slot) as served, aiohttp.ClientSession() as http:
        async with http.post(f"{served.url}/v1/completions", **post(hold)) as holder:
            await holder.content.readline()  # streaming: the one slot is taken
            waiting = asyncio.create_task(_ask(served, "completions", small))
            await until(
                lambda: served.api.guard.queued == 1, "a request queueing", 10.0, every_s=0.02
            )
            status, body = await _ask(served, "completions", small)
            assert status == 429 and "queue is full" in body["error"]["message"]
        # the holder hung up: its slot passes to the request that waited
        status, body = await waiting
        assert status == 200 and body["usage"]["completion_tokens"] <= 2
        await until(
            lambda: served.api.guard.in_flight == 0 and served.api.guard.queued == 0,
            "every slot freeing",
            10.0,
            every_s=0.02,
        )

    short_wait = policy(max_concurrent_requests=1, queue_size=4, queue_timeout_s=0.05)
    async with serve(tiny_runtime, short_wait) as served, aiohttp.ClientSession() as http:
        async with http.post(f"{served.url}/v1/completions", **post(hold)) as holder:
            await holder.content.readline()
            async with http.post(
                f"{served.url}/v1/completions", **post(json.dumps(small).encode())
            ) as refused:
                assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1
                assert "0.05 s of waiting" in (await refused.json())["error"]["message"]
        assert served.api.guard.queued == 0
