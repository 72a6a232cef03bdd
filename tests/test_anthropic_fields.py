"""Anthropic's /v1/messages bodies into swarm's request and its answers into Anthropic's
shapes, without a node: each field's mapping onto the sampling settings, system prompts and
content blocks as the OpenAI routes' messages, tools and tool_choice as the OpenAI route's,
each refusal naming what it refuses, and answers (whole and streamed, text and tool_use) as
the official client reads them."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.api.activity import Timing
from swarm.api.anthropic import AnthropicAnswer
from swarm.api.anthropic_fields import parse_messages
from swarm.api.backend import Done, TextDelta
from swarm.api.errors import ApiError, anthropic_body, too_many, unauthorized
from swarm.api.fields import parse_request
from swarm.sampling_settings import SamplingSettings

SERVED = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "Hello"}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _body(**fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "max_tokens": 16, "messages": HELLO, **fields}


MAPPED = [
    # (what, fields, the settings' fields that differ from swarm's defaults)
    ("defaults: temperature 1, as Anthropic's", {}, {}),
    ("greedy", {"temperature": 0}, {"temperature": 0.0}),
    ("top_k and top_p", {"top_k": 40, "top_p": 0.9}, {"top_k": 40, "top_p": 0.9}),
    ("stop_sequences", {"stop_sequences": ["\n\n", "User:"]}, {"stop": ("\n\n", "User:")}),
    ("no stop_sequences", {"stop_sequences": []}, {}),
    ("metadata and service_tier are dropped", {"metadata": {"user_id": "u-1"}}, {}),
    ("thinking disabled", {"thinking": {"type": "disabled"}, "service_tier": "auto"}, {}),
    ("streamed", {"stream": True}, {}),
]


@pytest.mark.parametrize(("what", "fields", "expected"), MAPPED, ids=[m[0] for m in MAPPED])
def test_fields_map_onto_the_sampling_settings(
    what: str, fields: dict[str, Any], expected: dict[str, Any]
) -> None:
    parsed = parse_messages(_body(**fields), SERVED)
    assert parsed.request.sampling == SamplingSettings(
        **{"max_tokens": 16, "temperature": 1.0, **expected}
    )
    assert parsed.stream is fields.get("stream", False) and parsed.tools is None


def _call_block(call_id: str = "toolu_1") -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "get_weather", "input": {"city": "Paris"}}


def _openai_call(call_id: str = "toolu_1") -> dict[str, Any]:
    arguments = json.dumps({"city": "Paris"})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }


TEXT = [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there", "cache_control": None}]
MESSAGES = [
    # (what, system, messages, the OpenAI routes' messages)
    ("a string", None, HELLO, HELLO),
    (
        "a system string",
        "Be brief.",
        HELLO,
        [{"role": "system", "content": "Be brief."}, *HELLO],
    ),
    (
        "system text blocks, joined as paragraphs",
        [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}] * 2,
        HELLO,
        [{"role": "system", "content": "Be brief.\n\nBe brief."}, *HELLO],
    ),
    ("an empty system", "", HELLO, HELLO),
    (
        "text blocks and a system message",
        None,
        [{"role": "system", "content": TEXT}, {"role": "user", "content": TEXT}],
        [{"role": "system", "content": "Hi\n\nthere"}, {"role": "user", "content": "Hi\n\nthere"}],
    ),
    (
        "a tool call and its result",
        None,
        [
            *HELLO,
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "Let me see."}, _call_block()],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
        [
            *HELLO,
            {"role": "assistant", "content": "Let me see.", "tool_calls": [_openai_call()]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny", "name": "get_weather"},
            {"role": "user", "content": "And tomorrow?"},
        ],
    ),
    (
        "two calls, results as blocks, one an error",
        None,
        [
            *HELLO,
            {"role": "assistant", "content": [_call_block("toolu_1"), _call_block("toolu_2")]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": TEXT},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True},
                ],
            },
        ],
        [
            *HELLO,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [_openai_call("toolu_1"), _openai_call("toolu_2")],
            },
            {
                "role": "tool",
                "tool_call_id": "toolu_1",
                "content": "Hi\n\nthere",
                "name": "get_weather",
            },
            {
                "role": "tool",
                "tool_call_id": "toolu_2",
                "content": "Error: ",
                "name": "get_weather",
            },
        ],
    ),
]


@pytest.mark.parametrize(
    ("what", "system", "messages", "expected"), MESSAGES, ids=[m[0] for m in MESSAGES]
)
def test_messages_become_the_openai_routes_messages(
    what: str, system: Any, messages: list[Any], expected: list[dict[str, Any]]
) -> None:
    fields = {"messages": messages} if system is None else {"messages": messages, "system": system}
    assert parse_messages(_body(**fields), SERVED).request.messages == expected


class _Backend:
    model_name = SERVED


def test_greedy_text_is_asked_as_the_openai_route_asks_it() -> None:
    """The same messages and settings: the same request, so the same text."""
    system = "Be brief."
    mine = parse_messages(_body(system=system, temperature=0, stop_sequences=["x"]), SERVED)
    openai_body = {
        "model": SERVED,
        "messages": [{"role": "system", "content": system}, *HELLO],
        "max_tokens": 16,
        "temperature": 0,
        "stop": ["x"],
    }
    theirs = parse_request(openai_body, _Backend(), chat=True)  # type: ignore[arg-type]
    assert mine.request == theirs.request


def test_tools_become_the_openai_routes_tools() -> None:
    openai_tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": WEATHER["input_schema"],
        },
    }
    for choice, mode, named, parallel in [
        (None, "auto", None, True),
        ({"type": "auto"}, "auto", None, True),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", None, False),
        ({"type": "tool", "name": "get_weather"}, "named", "get_weather", True),
        ({"type": "none"}, "none", None, True),
    ]:
        fields: dict[str, Any] = {"tools": [{**WEATHER, "type": "custom"}]}
        if choice is not None:
            fields["tool_choice"] = choice
        tools = parse_messages(_body(**fields), SERVED).tools
        assert tools is not None and tools.definitions == (openai_tool,)
        assert (tools.choice, tools.named, tools.parallel) == (mode, named, parallel)
        grammar = parse_messages(_body(**fields), SERVED).request.sampling.grammar
        assert (grammar is not None) == (mode in ("required", "named"))
    none = parse_messages(_body(tools=[WEATHER], tool_choice={"type": "none"}), SERVED)
    assert none.request.tools is None  # the prompt shows no tools


REFUSED = [
    # (what, fields, status, the field named, a fragment of the message)
    ("no max_tokens", {"max_tokens": None}, 400, "max_tokens", "required"),
    ("max_tokens 0", {"max_tokens": 0}, 400, "max_tokens", "[1, inf]"),
    ("no model", {"model": None}, 400, "model", "required"),
    ("temperature out of range", {"temperature": 3}, 400, "temperature", "[0.0, 2.0]"),
    ("top_k a float", {"top_k": 1.5}, 400, "top_k", "integer"),
    ("stop_sequences a string", {"stop_sequences": "x"}, 400, "stop_sequences", "array"),
    ("an unknown field", {"frequency": 1}, 400, "frequency", "unknown field"),
    (
        "thinking",
        {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        400,
        "thinking",
        "thinking",
    ),
    ("container", {"container": "c-1"}, 400, "container", "container is not supported"),
    ("mcp_servers", {"mcp_servers": []}, 400, "mcp_servers", "mcp_servers is not"),
    ("stream not a bool", {"stream": "yes"}, 400, "stream", "true or false"),
    ("no messages", {"messages": []}, 400, "messages", "non-empty"),
    (
        "a prefilled answer",
        {"messages": [*HELLO, {"role": "assistant", "content": "The"}]},
        400,
        "messages[1]",
        "prefilled",
    ),
    (
        "an image",
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        400,
        "messages[0].content[0].type",
        "images are not supported",
    ),
    (
        "a document",
        {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
        400,
        "messages[0].content[0].type",
        "documents",
    ),
    (
        "an image in a tool's result",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}
                    ],
                }
            ]
        },
        400,
        "messages[0].content[0].content[0].type",
        "images",
    ),
    (
        "a server tool's block",
        {"messages": [{"role": "user", "content": [{"type": "server_tool_use"}]}]},
        400,
        "messages[0].content[0].type",
        "runs no tools of its own",
    ),
    (
        "a tool_use in a user message",
        {"messages": [{"role": "user", "content": [_call_block()]}]},
        400,
        "messages[0].content[0].type",
        "a user message cannot hold tool_use",
    ),
    (
        "a thinking block",
        {
            "messages": [
                *HELLO,
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "."}]},
                *HELLO,
            ]
        },
        400,
        "messages[1].content[0].type",
        "thinking",
    ),
    (
        "an unknown block field",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]},
        400,
        "messages[0].content[0]",
        "'x'",
    ),
    (
        "a bad role",
        {"messages": [{"role": "tool", "content": "a"}]},
        400,
        "messages[0].role",
        "user",
    ),
    (
        "a server tool",
        {"tools": [{"type": "web_search_20250305", "name": "s"}]},
        400,
        "tools",
        "server tools",
    ),
    (
        "a tool without a schema",
        {"tools": [{"name": "f"}]},
        400,
        "tools",
        "input_schema is required",
    ),
    ("a bad tool name", {"tools": [{**WEATHER, "name": "a b"}]}, 400, "tools", "tools[0].name"),
    (
        "a bad schema",
        {"tools": [{**WEATHER, "input_schema": {"type": 7}}]},
        400,
        "tools",
        "tools[0].input_schema is invalid",
    ),
    ("two tools of one name", {"tools": [WEATHER, WEATHER]}, 400, "tools", "distinct"),
    (
        "a tool_choice naming no tool",
        {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
        400,
        "tool_choice",
        "'nope'",
    ),
    (
        "OpenAI's tool_choice",
        {"tools": [WEATHER], "tool_choice": "required"},
        400,
        "tool_choice",
        '{"type": "any"}',
    ),
    (
        "tool_choice without tools",
        {"tool_choice": {"type": "any"}},
        400,
        "tool_choice",
        "needs tools",
    ),
]


@pytest.mark.parametrize(
    ("what", "fields", "status", "param", "fragment"), REFUSED, ids=[r[0] for r in REFUSED]
)
def test_refusals_name_what_they_refuse(
    what: str, fields: dict[str, Any], status: int, param: str, fragment: str
) -> None:
    body = {k: v for k, v in _body(**fields).items() if v is not None}
    with pytest.raises(ApiError) as refused:
        parse_messages(body, SERVED)
    assert refused.value.status == status and refused.value.param == param
    assert fragment in refused.value.message


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ApiError(400, "bad"), "invalid_request_error"),
        (unauthorized("wrong"), "authentication_error"),
        (ApiError(404, "no", kind="not_found_error"), "not_found_error"),
        (ApiError(413, "big"), "request_too_large"),
        (too_many(4, 1), "rate_limit_error"),
        (ApiError(500, "oops", kind="server_error"), "api_error"),
        (ApiError(503, "down", kind="service_unavailable"), "overloaded_error"),
    ],
)
def test_errors_take_anthropics_shape(error: ApiError, kind: str) -> None:
    assert anthropic_body(error) == {
        "type": "error",
        "error": {"type": kind, "message": error.message},
    }


DONE = Done("stop", 12, 3, cached_tokens=4)
TIMING = Timing(elapsed_s=1.0, first_token_s=0.25)


def _streamed(answer: AnthropicAnswer, parts: list[str], done: Done) -> Message:
    """The stream's events as the official client reads and accumulates them."""
    raw = answer.opening(done.prompt_tokens) + b"".join(answer.part(TextDelta(p)) for p in parts)
    raw += answer.ending(done, TIMING) + answer.closing()
    for chunk in raw.decode().split("\n\n")[:-1]:
        name, data = chunk.split("\n")
        assert name == f"event: {json.loads(data.removeprefix('data: '))['type']}"

    def send(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"Content-Type": answer.content_type}, content=raw)

    transport = httpx2.MockTransport(send)
    with (
        anthropic.Anthropic(api_key="-", http_client=httpx2.Client(transport=transport)) as client,
        client.messages.stream(model=SERVED, max_tokens=16, messages=HELLO) as stream,  # type: ignore[arg-type]
    ):
        return stream.get_final_message()


ANSWERS = [
    # (what, parts, done, the content, stop_reason, stop_sequence)
    ("text", ["Hel", "lo"], DONE, [{"type": "text", "text": "Hello"}], "end_turn", None),
    ("empty", [], DONE, [{"type": "text", "text": ""}], "end_turn", None),
    (
        "cut off",
        ["Hel"],
        Done("length", 12, 1),
        [{"type": "text", "text": "Hel"}],
        "max_tokens",
        None,
    ),
    (
        "a stop sequence",
        ["Hel"],
        Done("stop", 12, 1, stop_sequence="lo"),
        [{"type": "text", "text": "Hel"}],
        "stop_sequence",
        "lo",
    ),
]


@pytest.mark.parametrize(
    ("what", "parts", "done", "content", "reason", "sequence"), ANSWERS, ids=[a[0] for a in ANSWERS]
)
def test_answers_whole_and_streamed(
    what: str,
    parts: list[str],
    done: Done,
    content: list[dict[str, Any]],
    reason: str,
    sequence: str | None,
) -> None:
    whole = Message.model_validate(AnthropicAnswer(SERVED).whole("".join(parts), (), done, TIMING))
    streamed = _streamed(AnthropicAnswer(SERVED), parts, done)
    for message in (whole, streamed):
        assert [b.model_dump(exclude_none=True) for b in message.content] == content
        assert (message.stop_reason, message.stop_sequence) == (reason, sequence)
        assert message.id.startswith("msg_") and message.model == SERVED
        assert message.role == "assistant" and message.type == "message"
    assert (
        whole.usage.input_tokens
        == streamed.usage.input_tokens
        == done.prompt_tokens - done.cached_tokens
    )
    assert (
        whole.usage.cache_read_input_tokens
        == streamed.usage.cache_read_input_tokens
        == done.cached_tokens
    )
    assert whole.usage.output_tokens == streamed.usage.output_tokens == done.completion_tokens


def test_a_call_is_a_tool_use_block() -> None:
    tools = parse_messages(_body(tools=[WEATHER]), SERVED).tools
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    whole = Message.model_validate(AnthropicAnswer(SERVED, tools).whole(call, (), DONE, TIMING))
    streamed = _streamed(AnthropicAnswer(SERVED, tools), [call[:9], call[9:]], DONE)
    for message in (whole, streamed):
        (block,) = message.content
        assert isinstance(block, anthropic.types.ToolUseBlock) and block.id.startswith("toolu_")
        assert (block.name, block.input) == ("get_weather", {"city": "Paris"})
        assert message.stop_reason == "tool_use" and message.stop_sequence is None
    # text that is no call passes on as text
    text = _streamed(AnthropicAnswer(SERVED, tools), ["It is ", "sunny."], DONE)
    assert [b.model_dump(exclude_none=True) for b in text.content] == [
        {"type": "text", "text": "It is sunny."}
    ]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
# mostly what a field should hold, sometimes anything at all
TEXT = st.text(max_size=8) | JSON_VALUES
OBJECT = st.dictionaries(st.text(max_size=4), st.integers(), max_size=2) | JSON_VALUES
TEXT_BLOCK = st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
BLOCKS = st.one_of(
    TEXT_BLOCK,
    st.fixed_dictionaries(
        {"type": st.just("tool_use"), "id": TEXT, "name": TEXT, "input": OBJECT},
    ),
    st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": TEXT},
        optional={"content": TEXT | st.lists(TEXT_BLOCK, max_size=2), "is_error": JSON_VALUES},
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["image", "thinking", 7])}),
    st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3),
)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system", "tool"]),
        "content": st.text(max_size=8) | st.lists(BLOCKS, max_size=3) | JSON_VALUES,
    }
)
FIELDS = {
    "messages": st.lists(MESSAGE, min_size=1, max_size=3).map(lambda m: [*m, *HELLO]) | JSON_VALUES,
    "system": st.text(max_size=8) | st.lists(BLOCKS, max_size=2) | JSON_VALUES,
    "max_tokens": st.integers(-2, 40) | JSON_VALUES,
    "stop_sequences": st.lists(st.text(max_size=4), max_size=5) | JSON_VALUES,
    "tools": st.lists(st.just(WEATHER) | OBJECT, max_size=2) | JSON_VALUES,
    "tool_choice": st.fixed_dictionaries(
        {"type": st.sampled_from(["auto", "any", "tool", "none", "x"])},
        optional={"name": st.just("get_weather") | JSON_VALUES},
    )
    | JSON_VALUES,
    "temperature": st.floats(0, 3) | JSON_VALUES,
    "top_k": st.integers(-1, 50) | JSON_VALUES,
}


@settings(max_examples=300, deadline=None)
@given(body=st.fixed_dictionaries({}, optional=FIELDS))
def test_any_body_is_a_request_or_an_api_error(body: dict[str, Any]) -> None:
    """Never another exception: bad input is a 4xx naming what is wrong, never a 500."""
    try:
        parse_messages(_body(**body), SERVED)
    except ApiError as e:
        assert 400 <= e.status < 500 and e.message
