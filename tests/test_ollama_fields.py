"""Ollama's request bodies into swarm's request and its answers into Ollama's shapes, without
a node: each option's mapping onto the sampling settings, each refusal naming what it
refuses, messages and tool calls in the OpenAI routes' shape, a call held back and sent as
Ollama's tool_calls, and the model routes' bodies as the official client reads them."""

from __future__ import annotations

import json
from typing import Any

import ollama
import pytest

from swarm.api.activity import Timing
from swarm.api.backend import Done, TextDelta
from swarm.api.errors import ApiError
from swarm.api.ollama import OllamaAnswer
from swarm.api.ollama_fields import (
    check_model,
    parse_chat,
    parse_generate,
    sampling,
)
from swarm.api.ollama_messages import chat_messages
from swarm.api.ollama_models import parameter_size, running, show, tags, version
from swarm.model_routing import ollama_name
from swarm.schema import ModelDetails

SERVED = "smollm2-135m-instruct"
PLACE_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
CONTEXT = 8192
HELLO = [{"role": "user", "content": "Hello"}]


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "messages": HELLO, **fields}


OLLAMA_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
MAPPED = [
    # (what, options, the settings' fields that differ from Ollama's defaults on swarm's)
    ("no options: Ollama's defaults", {}, {}),
    ("greedy", {"temperature": 0}, {"temperature": 0.0}),
    ("top_k off", {"top_k": 0, "top_p": 1}, {"top_k": 0, "top_p": 1.0}),
    ("min_p", {"min_p": 0.05}, {"min_p": 0.05}),
    ("num_predict", {"num_predict": 16}, {"max_tokens": 16}),
    ("num_predict -1: no limit", {"num_predict": -1}, {}),
    ("num_predict -2: fill the context", {"num_predict": -2}, {}),
    ("seed", {"seed": 7}, {"seed": 7}),
    ("seed -1: random", {"seed": -1}, {"seed": None}),
    ("stop", {"stop": ["\n", "User:"]}, {"stop": ("\n", "User:")}),
    ("repeat_penalty", {"repeat_penalty": 1.2}, {"repetition_penalty": 1.2}),
    (
        "repeat_penalty over the whole context",
        {"repeat_penalty": 1.2, "repeat_last_n": -1},
        {"repetition_penalty": 1.2},
    ),
    (
        "repeat_last_n 0 turns the penalties off",
        {"repeat_penalty": 1.2, "presence_penalty": 1, "repeat_last_n": 0},
        {},
    ),
    ("a window without a penalty", {"repeat_last_n": 64}, {}),
    (
        "presence and frequency, as OpenAI's",
        {"presence_penalty": 0.5, "frequency_penalty": 0.25},
        {"presence_penalty": 0.5, "frequency_penalty": 0.25},
    ),
    (
        "whole floats for integers",
        {"top_k": 20.0, "num_predict": 8.0},
        {"top_k": 20, "max_tokens": 8},
    ),
    (
        "runtime options, and samplers at off",
        {
            "num_ctx": 8192.0,
            "num_thread": 4,
            "num_gpu": 99,
            "use_mmap": False,
            "num_keep": 5,
            "mirostat": 0,
            "mirostat_tau": 5.0,
            "typical_p": 1,
            "tfs_z": 1.0,
            "penalize_newline": True,
        },
        {},
    ),
]


@pytest.mark.parametrize(("what", "options", "changed"), MAPPED, ids=[m[0] for m in MAPPED])
def test_options_map_onto_the_sampling_settings(
    what: str, options: dict[str, Any], changed: dict[str, Any]
) -> None:
    settings = sampling({"options": options}, CONTEXT)
    expected = {**OLLAMA_DEFAULTS, "max_tokens": None, "seed": None, **changed}
    assert {name: getattr(settings, name) for name in expected} == expected
    untouched = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    for name, neutral in untouched.items():
        assert getattr(settings, name) == changed.get(name, neutral)


def test_format_and_logprobs_become_the_grammar_and_logprobs() -> None:
    assert sampling({}, CONTEXT).grammar is None
    assert sampling({"format": ""}, CONTEXT).grammar is None
    assert sampling({"format": "json"}, CONTEXT).grammar
    assert sampling({"format": PLACE_SCHEMA}, CONTEXT).grammar
    assert sampling({"logprobs": True, "top_logprobs": 3}, CONTEXT).logprobs == 3
    assert sampling({"logprobs": True}, CONTEXT).logprobs == 0


REFUSED = [
    # (what, the body, the status, fragment of the message: the name of what is refused)
    ("mirostat", _chat(options={"mirostat": 2}), 400, "options.mirostat is not supported"),
    ("typical_p", _chat(options={"typical_p": 0.9}), 400, "options.typical_p"),
    ("tfs_z", _chat(options={"tfs_z": 0.5}), 400, "options.tfs_z"),
    ("penalize_newline", _chat(options={"penalize_newline": False}), 400, "penalize_newline"),
    ("num_ctx over the context", _chat(options={"num_ctx": 32768}), 400, "options.num_ctx"),
    (
        "a penalty window",
        _chat(options={"repeat_penalty": 1.1, "repeat_last_n": 64}),
        400,
        "options.repeat_last_n = 64",
    ),
    ("num_predict 0", _chat(options={"num_predict": 0}), 400, "options.num_predict"),
    ("temperature", _chat(options={"temperature": 3}), 400, "options.temperature must be in"),
    ("top_k a fraction", _chat(options={"top_k": 4.5}), 400, "options.top_k must be an integer"),
    ("unknown option", _chat(options={"frobnicate": 1}), 400, "unknown option 'frobnicate'"),
    ("options a list", _chat(options=[1]), 400, "options must be an object"),
    ("stop", _chat(options={"stop": ["a", "b", "c", "d", "e"]}), 400, "options.stop"),
    (
        "images",
        _chat(messages=[{"role": "user", "content": "What is this?", "images": ["aGk="]}]),
        400,
        "messages[0].images",
    ),
    ("think", _chat(think=True), 400, "think is not supported"),
    ("format", _chat(format="yaml"), 400, 'format must be "json"'),
    ("format schema", _chat(format={"type": "foo"}), 400, "format's JSON schema is invalid"),
    ("unknown field", _chat(frobnicate=1), 400, "unknown field 'frobnicate'"),
    ("role", _chat(messages=[{"role": "robot", "content": "hi"}]), 400, "messages[0].role"),
    ("thinking", _chat(messages=[{**HELLO[0], "thinking": "hm"}]), 400, "messages[0].thinking"),
    ("top_logprobs", _chat(top_logprobs=2), 400, "top_logprobs needs logprobs"),
    ("stream", _chat(stream="yes"), 400, "stream must be true or false"),
    ("no model", {"messages": HELLO}, 400, "model is required"),
]


@pytest.mark.parametrize(
    ("what", "body", "status", "fragment"), REFUSED, ids=[r[0] for r in REFUSED]
)
def test_chat_refusals_name_what_they_refuse(
    what: str, body: dict[str, Any], status: int, fragment: str
) -> None:
    with pytest.raises(ApiError) as refused:
        parse_chat(body, SERVED, CONTEXT)
    assert refused.value.status == status
    assert fragment in refused.value.message


GENERATE_REFUSED = [
    ("template", {"template": "{{ .Prompt }}"}, "template is not supported"),
    ("suffix", {"suffix": "return x"}, "suffix"),
    ("context", {"context": [1, 2, 3]}, "context is not supported"),
    ("images", {"images": ["aGk="]}, "images are not supported"),
    ("image generation", {"width": 512}, "width: image generation"),
    ("system with raw", {"raw": True, "system": "Be brief."}, "system cannot be used with raw"),
]


@pytest.mark.parametrize(
    ("what", "fields", "fragment"), GENERATE_REFUSED, ids=[r[0] for r in GENERATE_REFUSED]
)
def test_generate_refusals_name_what_they_refuse(
    what: str, fields: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ApiError) as refused:
        parse_generate({"model": SERVED, "prompt": "Hi", **fields}, SERVED, CONTEXT)
    assert refused.value.status == 400 and fragment in refused.value.message


def test_generate_is_a_chat_turn_unless_raw() -> None:
    plain = parse_generate(
        {"model": SERVED, "prompt": "Hi", "system": "Be brief.", "stream": False}, SERVED, CONTEXT
    )
    assert plain.request is not None and plain.request.prompt is None and not plain.stream
    assert plain.request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    raw = parse_generate(
        {"model": f"{SERVED}:latest", "prompt": "Hi", "raw": True}, SERVED, CONTEXT
    )
    assert raw.request is not None and raw.request.prompt == "Hi" and raw.request.messages is None
    assert raw.stream and raw.model == f"{SERVED}:latest"  # Ollama streams by default


def test_nothing_to_generate_loads_or_unloads() -> None:
    loaded = parse_chat({"model": SERVED, "messages": []}, SERVED, CONTEXT)
    assert loaded.request is None and not loaded.unload
    unloaded = parse_generate({"model": SERVED, "keep_alive": 0}, SERVED, CONTEXT)
    assert unloaded.request is None and unloaded.unload
    with pytest.raises(ApiError, match=r"options\.mirostat"):  # options are checked regardless
        parse_generate({"model": SERVED, "options": {"mirostat": 1}}, SERVED, CONTEXT)


def test_model_names_with_and_without_ollamas_tag() -> None:
    assert ollama_name(SERVED) == f"{SERVED}:latest"
    assert ollama_name("llama3.2:3b") == "llama3.2:3b"
    assert ollama_name("registry.local:5000/team/m") == "registry.local:5000/team/m:latest"
    assert check_model({"model": f"{SERVED}:latest"}) == f"{SERVED}:latest"
    with pytest.raises(ApiError, match="model is required"):
        check_model({"model": ""})


def test_tool_calls_and_results_take_the_openai_routes_shape() -> None:
    weather = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = chat_messages(
        [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": "", "tool_calls": [weather, weather]},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
            {"role": "tool", "content": "rain"},
        ]
    )
    calls = messages[1]["tool_calls"]
    assert calls[0] == {
        "id": "call_1_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    assert [m.get("tool_call_id") for m in messages[2:]] == ["call_1_0", "call_1_1"]
    assert messages[2]["name"] == "get_weather"
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object"}},
    }
    parsed = parse_chat(_chat(tools=[tool]), SERVED, CONTEXT)
    assert parsed.tools is not None and parsed.request is not None
    assert parsed.request.tools == (tool,)
    assert parse_chat(_chat(tools=[]), SERVED, CONTEXT).tools is None  # the client's default


@pytest.mark.parametrize(
    ("parameters", "written"),
    [(134_515_008, "134.5M"), (8_030_261_248, "8.0B"), (4_000, "4.0K"), (12, "12")],
)
def test_parameter_size_as_ollama_writes_it(parameters: int, written: str) -> None:
    assert parameter_size(parameters) == written


DETAILS = ModelDetails(
    name=SERVED,
    family="llama",
    format="gguf",
    parameters=134_515_008,
    size_bytes=100_000_000,
    quantization="Q4_1",
    digest="ab" * 32,
    context_tokens=CONTEXT,
    layers=30,
    hidden_size=576,
    chat_template="{{ messages }}",
    loaded_unix=1_700_000_000.5,
)


def test_the_model_routes_read_as_the_official_client_reads_them() -> None:
    listed = ollama.ListResponse(**tags(DETAILS)).models
    assert [m.model for m in listed] == [f"{SERVED}:latest"]
    assert listed[0].details is not None and listed[0].details.quantization_level == "Q4_1"
    assert listed[0].modified_at is not None and listed[0].modified_at.year == 2023
    shown = ollama.ShowResponse(**show(DETAILS))
    assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == CONTEXT
    assert shown.template == "{{ messages }}" and shown.capabilities == ["completion", "tools"]
    assert shown.parameters is not None and "temperature 0.8" in shown.parameters
    ps = ollama.ProcessResponse(**running(DETAILS)).models
    assert ps[0].context_length == CONTEXT and ps[0].expires_at is not None
    assert version()["version"].count(".") == 2


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": PLACE_SCHEMA}}


def test_a_call_is_held_back_and_sent_as_ollamas_tool_calls() -> None:
    parsed = parse_chat(_chat(tools=[WEATHER]), SERVED, CONTEXT)
    answer = OllamaAnswer(parsed, chat=True)
    call = ['{"name": "get_weather", ', '"arguments": {"city": "Paris"}}']
    assert [answer.part(TextDelta(piece)) for piece in call] == [b"", b""]  # could be a call
    done, timing = Done("stop", 5, 9), Timing(elapsed_s=1.0, first_token_s=0.25)
    lines = [
        ollama.ChatResponse(**json.loads(line)) for line in answer.ending(done, timing).splitlines()
    ]
    assert [line.done for line in lines] == [False, True]
    (made,) = lines[0].message.tool_calls or ()
    assert made.function.name == "get_weather" and made.function.arguments == {"city": "Paris"}
    last = lines[1]
    assert (last.prompt_eval_count, last.eval_count, last.done_reason) == (5, 9, "stop")
    assert (last.total_duration, last.prompt_eval_duration, last.eval_duration) == (
        1_000_000_000,
        250_000_000,
        750_000_000,
    )
    whole = ollama.ChatResponse(**answer.whole("".join(call), (), done, timing))
    assert whole.message.content == "" and whole.message.tool_calls


def test_text_that_cannot_be_a_call_streams_at_once() -> None:
    parsed = parse_chat(_chat(tools=[WEATHER]), SERVED, CONTEXT)
    answer = OllamaAnswer(parsed, chat=True)
    line = ollama.ChatResponse(**json.loads(answer.part(TextDelta("It is sunny"))))
    assert line.message.content == "It is sunny" and not line.done
    plain = OllamaAnswer(parse_generate({"model": SERVED, "prompt": "Hi"}, SERVED, CONTEXT), False)
    streamed = ollama.GenerateResponse(**json.loads(plain.part(TextDelta("Hello"))))
    assert streamed.response == "Hello" and streamed.model == SERVED
