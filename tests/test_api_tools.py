"""Tools and structured output: the chat template's rendering of tools (native and generic),
finding calls in an answer, and, over a real socket in front of the real inference service on
a tiny random model whose tokenizer spells bytes, the official `openai` client's tool-call
round trip (whole and streamed) and JSON answers that parse and validate."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import jsonschema
import pydantic
import pytest

from harness.api_server import MODEL, Served, openai_client, policy, serve
from harness.factories import tiny_bytes_tokenizer, write_tiny_bytes_llama
from swarm.api.backend import TextDelta
from swarm.api.tools import CallWatch, Tools, parse_tools
from swarm.config import RuntimeConfig
from swarm.errors import SamplingError
from swarm.runtime.text.chat import render_chat
from swarm.runtime.text.hf_tokenizer import HFTokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}}
ANSWER = {  # bounded, so a random model's answer ends within a few dozen bytes
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", "high"]}},
    "required": ["ok", "level"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "weather in Oslo?"}]
OFFER: dict[str, Any] = {"model": MODEL, "messages": ASK, "tools": [WEATHER, CLOCK]}


@pytest.fixture(scope="module")
def bytes_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-bytes")
    write_tiny_bytes_llama(folder)
    return folder


@pytest.fixture
async def served(bytes_folder: Path, tmp_path: Path) -> AsyncIterator[Served]:
    runtime = RuntimeConfig(model=str(bytes_folder), cache_dir=tmp_path / "cache", threads=1)
    async with serve(runtime, policy(), context=1024) as s:
        yield s


def _tools(**body: Any) -> Tools:
    tools = parse_tools({"tools": [WEATHER, CLOCK], **body})
    assert tools is not None
    return tools


CALLS = [
    # (answer, the calls found as (name, arguments))
    ('{"name": "get_weather", "arguments": {"city": "Oslo"}}', [("get_weather", {"city": "Oslo"})]),
    ('  {"name": "clock", "parameters": {}}', [("clock", {})]),
    (
        '<tool_call>\n{"name": "clock", "arguments": {}}\n</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}</tool_call>',
        [("clock", {}), ("get_weather", {"city": "Rome"})],
    ),
    ('```json\n[{"name": "clock", "arguments": {}}]\n```', [("clock", {})]),
    ('{"name": "unknown", "arguments": {}}', []),
    ('{"name": "clock", "arguments": [1]}', []),
    ('It is {"name": "clock", "arguments": {}}', []),
    ('{"name": "clock", "arguments": {', []),
    ("plain words", []),
]


@pytest.mark.parametrize(("text", "expected"), CALLS)
def test_calls_are_found_only_where_the_answer_is_wholly_calls(
    text: str, expected: list[tuple[str, dict[str, Any]]]
) -> None:
    calls = _tools().calls_in(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == expected
    assert len({c.id for c in calls}) == len(calls)
    assert len(_tools(parallel_tool_calls=False).calls_in(text)) == min(1, len(expected))
    assert _tools(tool_choice="none").calls_in(text) == ()


def test_a_stream_holds_back_only_what_may_be_a_call() -> None:
    watch = CallWatch(_tools())
    assert watch.push(TextDelta("  ")) is None
    assert watch.push(TextDelta("<tool")) is None
    released = watch.push(TextDelta("box> hi"))
    assert released is not None and released.text == "  <toolbox> hi"
    assert watch.push(TextDelta(" more")) == TextDelta(" more")
    assert watch.finish() == (None, ())

    watch = CallWatch(_tools())
    assert watch.push(TextDelta('{"name": "clock", ')) is None
    assert watch.push(TextDelta('"arguments": {}}')) is None
    held, calls = watch.finish()
    assert held is None and [c.name for c in calls] == ["clock"]

    watch = CallWatch(_tools())
    assert watch.push(TextDelta("{not json}")) is None
    held, calls = watch.finish()
    assert held == TextDelta("{not json}") and calls == ()


NATIVE = (
    "{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' and 'strict' in m['content'] %}"
    "{{ raise_exception('no tool turns here') }}{% endif %}"
    "[{{ m['role'] }}] {{ m['content'] }}"
    "{% for c in m.get('tool_calls', []) %} CALL {{ c['function']['name'] }}"
    " {{ c['function']['arguments']['city'] }}{% endfor %}\n"
    "{% endfor %}"
)
HISTORY = [
    {"role": "developer", "content": "be brief"},
    *ASK,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]


def test_a_template_that_knows_tools_renders_them_itself() -> None:
    tokenizer = tiny_bytes_tokenizer()
    tokenizer.chat_template = NATIVE
    text = tokenizer.decode(render_chat(HFTokenizer(tokenizer), HISTORY, [WEATHER]))
    assert text.startswith('TOOLS [{"type": "function", "function": {"name": "get_weather"')
    # developer becomes system where the template does not name it; arguments become a mapping
    assert "[system] be brief[user]" in text and "CALL get_weather Oslo" in text
    assert "[tool] sunny" in text
    refused = [*HISTORY[:-1], {"role": "tool", "tool_call_id": "c1", "content": "strict"}]
    with pytest.raises(SamplingError, match="no tool turns here") as caught:
        render_chat(HFTokenizer(tokenizer), refused, [WEATHER])
    assert caught.value.param == "messages"


def test_a_template_without_tools_gets_them_in_the_system_prompt() -> None:
    tokenizer = tiny_bytes_tokenizer()  # its template knows no tools
    text = tokenizer.decode(render_chat(HFTokenizer(tokenizer), HISTORY, [WEATHER]))
    system, rest = text.split("</s>", 1)
    assert system.startswith("<s>system\nbe brief\n\nYou can call these tools")
    assert json.dumps(WEATHER["function"]) in system
    assert '<s>assistant\n{"name": "get_weather", "arguments": {"city": "Oslo"}}</s>' in rest
    assert "<s>user\nResult of tool call c1:\nsunny</s>" in rest
    plain = render_chat(HFTokenizer(tokenizer), HISTORY, None)
    assert "You can call" not in tokenizer.decode(plain)


async def test_a_tool_call_round_trip_with_the_openai_client(served: Served) -> None:
    async with openai_client(served) as client:
        called = await client.chat.completions.create(
            **OFFER,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            temperature=0,
            max_tokens=80,
        )
        choice = called.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls or []
        assert call.type == "function" and call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])

        answered = await client.chat.completions.create(
            **{
                **OFFER,
                "messages": [
                    *ASK,
                    choice.message.model_dump(),  # as clients send it back, nulls and all
                    {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
                ],
            },
            tool_choice="none",
            temperature=0,
            max_tokens=5,
        )
    assert answered.choices[0].message.tool_calls is None
    assert isinstance(answered.choices[0].message.content, str)
    assert served.kv_sessions() == 0


async def test_a_required_call_streams_as_tool_call_deltas(served: Served) -> None:
    async with openai_client(served) as client:
        stream = await client.chat.completions.create(
            **OFFER,
            tool_choice="required",
            temperature=0.8,
            seed=3,
            max_tokens=80,
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any(d.content for d in deltas)  # a call is never leaked as text
    calls = [call for d in deltas for call in d.tool_calls or []]
    assert calls and all(c.index == i for i, c in enumerate(calls))
    names = {"get_weather", "clock"}
    assert all(c.id and c.function and c.function.name in names for c in calls)
    assert all(isinstance(json.loads(c.function.arguments or ""), dict) for c in calls)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
async def test_json_answers_parse_and_validate(served: Served, stream: bool) -> None:
    formats: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}, ANSWER),
        ({"type": "json_object"}, {"type": "object"}),
    ]
    # an object of any shape may nest deep and hold long strings before it closes; a bias to
    # closing quotes and braces keeps the random model's answers short
    closing = served.local.entry.tokenizer.encode('"}', add_special=False)
    bias = {str(token): 6.0 for token in closing}
    async with openai_client(served) as client:
        for response_format, schema in formats:
            # concurrent requests: each keeps its own grammar state at the entry
            texts = await asyncio.gather(
                *(_answer(client, response_format, seed, stream, bias) for seed in range(3))
            )
            for text in texts:
                jsonschema.validate(json.loads(text), schema)


async def _answer(
    client: Any, response_format: dict[str, Any], seed: int, stream: bool, bias: dict[str, float]
) -> str:
    ask = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "json please"}],
        response_format=response_format,
        temperature=1.0,
        seed=seed,
        max_tokens=400,
        logit_bias=bias,
    )
    if not stream:
        answer = await client.chat.completions.create(**ask)
        assert answer.choices[0].finish_reason == "stop"
        return str(answer.choices[0].message.content)
    chunks = [c async for c in await client.chat.completions.create(**ask, stream=True)]
    assert chunks[-1].choices[0].finish_reason == "stop"
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


class Verdict(pydantic.BaseModel):
    ok: bool
    level: Literal["low", "high"]


async def test_the_openai_clients_parse_gets_its_pydantic_model(served: Served) -> None:
    """`parse` sends the model's strict JSON schema and parses the answer back into it."""
    async with openai_client(served) as client:
        answer = await client.chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": "verdict?"}],
            response_format=Verdict,
            temperature=0,
            max_tokens=64,
        )
    assert isinstance(answer.choices[0].message.parsed, Verdict)
