"""Anthropic's Messages API on a real node process (the real model, an API token configured),
driven by the official `anthropic` client: greedy text streamed and whole equal to the OpenAI
route's for the same messages, a forced tool call and a second turn with its result,
stop_sequences, the token as x-api-key and a wrong one, an unknown model and unsupported
fields refused in Anthropic's shape, and docs/api.md's examples as written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types import Message

from harness.cluster import Cluster, node_behind_token
from harness.doc_examples import run_section
from swarm.config import RuntimeConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOKEN = "anthropic-e2e-token-93be"
MODEL = "smollm2-135m-instruct"
CAPITAL: Any = [{"role": "user", "content": "What is the capital of France?"}]
# The client's own arguments have no sampling fields any more; the API still takes them.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def node(
    smol_runtime: RuntimeConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    yield from node_behind_token(smol_runtime, tmp_path_factory, TOKEN)


def _anthropic(node: Cluster, key: str = TOKEN) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=f"http://{node.addresses[0]}", api_key=key, max_retries=0
    )


def _openai(node: Cluster) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"http://{node.addresses[0]}/v1", api_key=TOKEN, max_retries=0
    )


def _text(message: Message) -> str:
    (block,) = message.content
    assert block.type == "text"
    return block.text


async def _both(node: Cluster, **fields: Any) -> tuple[Message, Message, list[str]]:
    """The answer whole, streamed, and the stream's text deltas."""
    async with _anthropic(node) as client:
        whole = await client.messages.create(model=MODEL, **fields)
        async with client.messages.stream(model=MODEL, **fields) as stream:
            texts = [text async for text in stream.text_stream]
            streamed = await stream.get_final_message()
    return whole, streamed, texts


@pytest.mark.parametrize("system", [None, "Answer in one short sentence."])
async def test_greedy_text_is_the_openai_routes(node: Cluster, system: str | None) -> None:
    fields: dict[str, Any] = {"max_tokens": 24, "messages": CAPITAL, "extra_body": GREEDY}
    openai_messages = CAPITAL
    if system is not None:
        fields["system"] = system
        openai_messages = [{"role": "system", "content": system}, *CAPITAL]
    whole, streamed, texts = await _both(node, **fields)
    async with _openai(node) as oa:
        theirs = await oa.chat.completions.create(
            model=MODEL, messages=openai_messages, max_tokens=24, temperature=0
        )
    text = theirs.choices[0].message.content
    assert "Paris" in _text(whole) and _text(whole) == _text(streamed) == "".join(texts) == text
    finish = {"stop": "end_turn", "length": "max_tokens"}[theirs.choices[0].finish_reason]
    assert whole.stop_reason == streamed.stop_reason == finish
    assert theirs.usage is not None
    for message in (whole, streamed):
        assert message.usage.output_tokens == theirs.usage.completion_tokens
        cached = message.usage.cache_read_input_tokens or 0
        assert message.usage.input_tokens + cached == theirs.usage.prompt_tokens
        assert message.id.startswith("msg_") and message.model == MODEL


async def test_stop_sequences_end_the_text_before_them(node: Cluster) -> None:
    fields = {"max_tokens": 24, "messages": CAPITAL, "extra_body": GREEDY}
    free, _, _ = await _both(node, **fields)
    assert "Paris" in _text(free)
    before = _text(free).split("Paris")[0]
    whole, streamed, texts = await _both(node, **fields, stop_sequences=["Lyon", "Paris"])
    assert _text(whole) == _text(streamed) == "".join(texts) == before
    for message in (whole, streamed):
        assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "Paris")


WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


async def test_a_forced_tool_call_and_its_result(node: Cluster) -> None:
    """As the LangChain test drives the OpenAI route: the call forced, the result sent back
    as a tool_result block, and the model's answer from it."""
    ask: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice: Any = {"type": "tool", "name": "get_weather"}
    fields = {"max_tokens": 32, "tools": [WEATHER], "extra_body": GREEDY}
    asked, streamed, _ = await _both(node, messages=ask, tool_choice=choice, **fields)
    for message in (asked, streamed):
        (call,) = message.content
        assert call.type == "tool_use" and call.id.startswith("toolu_")
        assert call.name == "get_weather" and "Paris" in call.input["city"]  # type: ignore[index]
        assert message.stop_reason == "tool_use"
    (call,) = asked.content
    assert call.type == "tool_use"
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C in Paris"}
    turns = [
        *ask,
        {"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
        {"role": "user", "content": [result]},
    ]
    async with _anthropic(node) as client:
        answer = await client.messages.create(model=MODEL, messages=turns, **fields)
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert "sunny" in _text(answer).lower()


async def test_keys_models_and_fields_refused_in_anthropics_shape(node: Cluster) -> None:
    async with _anthropic(node, "wrong-key") as client:
        with pytest.raises(anthropic.AuthenticationError) as denied:
            await client.messages.create(model=MODEL, max_tokens=4, messages=CAPITAL)
    assert denied.value.status_code == 401
    assert denied.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "the API token is wrong"},
    }
    async with _anthropic(node) as client:
        with pytest.raises(anthropic.NotFoundError) as unknown:
            await client.messages.create(model="claude-opus-4-1", max_tokens=4, messages=CAPITAL)
        with pytest.raises(anthropic.BadRequestError) as thinking:
            await client.messages.create(
                model=MODEL,
                max_tokens=4,
                messages=CAPITAL,
                thinking={"type": "enabled", "budget_tokens": 1024},
            )
        picture: Any = [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}},
                ],
            }
        ]
        with pytest.raises(anthropic.BadRequestError) as image:
            await client.messages.create(model=MODEL, max_tokens=4, messages=picture)
    assert unknown.value.status_code == 404 and MODEL in unknown.value.message
    assert isinstance(unknown.value.body, dict)
    assert unknown.value.body["error"]["type"] == "not_found_error"
    assert "thinking" in thinking.value.message
    assert "messages[0].content[1]" in image.value.message and "images" in image.value.message


def test_the_docs_examples_run_as_written(node: Cluster, tmp_path: Path) -> None:
    ran = run_section("docs/api.md", "Anthropic's Messages API", node.addresses[0], TOKEN, tmp_path)
    events = [json.loads(line[6:]) for line in ran.shell.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert text.strip(), ran.shell
    assert len(ran.python.split()) > 3, ran.python
