"""Request bodies of /v1/chat/completions and /v1/completions into GenerationRequest.

Every field a client may send is listed here and either honoured or refused with a 400 that
names it: a client that asks for something this server does not do hears so, instead of
getting an answer that quietly ignores the ask."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swarm.api.backend import Backend, GenerationRequest
from swarm.api.errors import bad_request
from swarm.api.formats import response_format
from swarm.api.tools import Tools, parse_tools
from swarm.errors import SamplingError
from swarm.sampling_settings import BOUNDS, LOGIT_BIAS, TOP_LOGPROBS_MAX, SamplingSettings

_ROLES = ("system", "developer", "user", "assistant", "tool")
# Keys of a message other than role and content; others are refused unless null (a client
# that sends back the assistant message it got echoes OpenAI's null refusal and audio).
_MESSAGE_FIELDS = frozenset({"name", "tool_calls", "tool_call_id"})
_MAX_STOP = 4
MAX_STOP_CHARS = 256  # characters of one stop string: each is looked for as text streams
_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F]")
_MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for /v1/completions
_MAX_LOGIT_BIAS = 300  # entries; OpenAI accepts a few hundred

# Fields that change nothing about the answer: accepted and dropped.
_METADATA = frozenset({"user", "metadata", "store", "service_tier"})
_SHARED = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "n",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "seed",
        "stop",
        "speculate",  # swarm's own: false turns drafting off for this request
        "cache_prompt",  # llama.cpp's name: false computes the whole prompt afresh
    }
)
_CHAT_ONLY = frozenset(
    {
        "messages",
        "max_completion_tokens",
        "top_logprobs",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    }
)
_COMPLETIONS_ONLY = frozenset({"prompt", "echo", "suffix", "best_of"})
# Known to OpenAI's API, not done here yet: always a 400 naming the field.
_NOT_YET = frozenset(
    {
        "functions",
        "function_call",
        "modalities",
        "audio",
        "prediction",
        "reasoning_effort",
        "web_search_options",
    }
)


def read_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):  # JSONDecodeError; integers of 4300+ digits
        raise bad_request("the request body is not valid JSON") from None
    except RecursionError:
        raise bad_request("the request body nests too deeply") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw):  # only then can a string hold half a character
        try:
            json.dumps(body, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise bad_request(
                "the request body has a lone UTF-16 surrogate (\\ud800..\\udfff)"
            ) from None
    return body


@dataclass(frozen=True)
class Parsed:
    request: GenerationRequest
    stream: bool
    include_usage: bool  # a last chunk with only the usage
    tools: Tools | None  # where the request offers tools


def parse_request(body: dict[str, Any], backend: Backend, chat: bool) -> Parsed:
    """The request, or an ApiError naming the bad field."""
    _refuse_unknown(body, chat)
    check_served_model(body)
    if body.get("n", 1) != 1:
        raise bad_request("only n = 1 is supported", "n")
    messages, prompt = (_messages(body), None) if chat else (None, _prompt(body))
    tools = parse_tools(body) if chat else None
    request = GenerationRequest(
        messages=messages,
        prompt=prompt,
        sampling=_sampling(body, chat, tools),
        tools=None if tools is None else tools.rendered,
    )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("stream must be true or false", "stream")
    return Parsed(request, stream, _include_usage(body, stream), tools)


def _sampling(body: dict[str, Any], chat: bool, tools: Tools | None) -> SamplingSettings:
    """The settings, each number's type checked here and its range by the one table."""
    try:
        return SamplingSettings(
            max_tokens=_max_tokens(body),
            temperature=setting(body, "temperature", float, 1.0),  # OpenAI's default
            top_p=setting(body, "top_p", float, 1.0),
            top_k=setting(body, "top_k", int, 0),
            min_p=setting(body, "min_p", float, 0.0),
            repetition_penalty=setting(body, "repetition_penalty", float, 1.0),
            presence_penalty=setting(body, "presence_penalty", float, 0.0),
            frequency_penalty=setting(body, "frequency_penalty", float, 0.0),
            logit_bias=_logit_bias(body),
            logprobs=chat_logprobs(body) if chat else _completion_logprobs(body),
            seed=setting(body, "seed", int, None),
            stop=_stop(body),
            grammar=_grammar(body, tools) if chat else None,
            speculate=_flag(body, "speculate"),
            cache_prompt=_flag(body, "cache_prompt"),
        )
    except SamplingError as e:
        raise bad_request(str(e), e.param) from None


def _flag(body: dict[str, Any], name: str) -> bool:
    """One of swarm's own switches, on unless the request says false."""
    wanted = body.get(name, True)
    if not isinstance(wanted, bool):
        raise bad_request(f"{name} must be true or false", name)
    return wanted


def setting(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    """body[name] as `kind` within BOUNDS[name], or `default` where absent."""
    bound = BOUNDS[name]
    return number(body, name, kind, default, low=bound.low, high=bound.high)


def _grammar(body: dict[str, Any], tools: Tools | None) -> str | None:
    """What the answer must match: the response format, or a call where one is required."""
    answer = response_format(body)
    call = None if tools is None else tools.grammar()
    if answer is not None and call is not None:
        raise bad_request(
            "response_format cannot be combined with a tool_choice that requires a call",
            "response_format",
        )
    return answer or call


def _refuse_unknown(body: dict[str, Any], chat: bool) -> None:
    own = _CHAT_ONLY if chat else _COMPLETIONS_ONLY
    for name, value in body.items():
        if name in _NOT_YET:
            raise bad_request(f"{name} {_NOT_YET_MESSAGE}", name)
        if name not in _SHARED and name not in own and name not in _METADATA:
            raise bad_request(f"unknown field {name!r}", name)
        if value is not None and name in _ONLY and not _ONLY[name][0](value):
            raise bad_request(_ONLY[name][1], name)


_NOT_YET_MESSAGE = "is not supported yet by this server"
# Fields honoured only at the value that asks for nothing: (that value's test, the refusal).
_ONLY: dict[str, tuple[Callable[[Any], bool], str]] = {
    "echo": (lambda v: v is False, f"echo {_NOT_YET_MESSAGE}"),
    "suffix": (lambda v: v == "", f"suffix {_NOT_YET_MESSAGE}"),
    "best_of": (lambda v: v == 1, "only best_of = 1 is supported"),
}


def chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat: logprobs true or false, top_logprobs the alternatives (0..20, needs logprobs)."""
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise bad_request("logprobs must be true or false", "logprobs")
    top: int | None = number(body, "top_logprobs", int, None, low=0, high=TOP_LOGPROBS_MAX)
    if top is not None and not wanted:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    return (top or 0) if wanted else None


def _completion_logprobs(body: dict[str, Any]) -> int | None:
    """Completions: logprobs is the number of alternatives (0..5), absent for none."""
    top: int | None = number(body, "logprobs", int, None, low=0, high=_MAX_COMPLETION_LOGPROBS)
    return top


def check_served_model(body: dict[str, Any]) -> None:
    """`model`, where given, must be a string; which model it names, and whether the swarm
    serves it, the router decides before the body gets here (`api/model_routes.py`)."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string", "model")


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty array", "messages")
    return [_message(m, i) for i, m in enumerate(messages)]


def _message(m: Any, i: int) -> dict[str, Any]:
    """One message as the chat template gets it: role, content, and the tool fields."""
    role = m.get("role") if isinstance(m, dict) else None
    if role not in _ROLES:
        raise bad_request(
            f"messages[{i}].role must be one of {', '.join(_ROLES)}", f"messages[{i}].role"
        )
    extra = {k for k, v in m.items() if v is not None} - _MESSAGE_FIELDS - {"role", "content"}
    if extra:
        raise bad_request(f"unknown field {sorted(extra)[0]!r} in messages[{i}]", "messages")
    out: dict[str, Any] = {"role": role}
    calls = m.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise bad_request("only assistant messages have tool_calls", f"messages[{i}]")
        out["tool_calls"] = [_past_call(c, i) for c in _list(calls, i)]
    content = _content(m.get("content"))
    if content is None and not (calls and m.get("content") is None):
        raise bad_request(
            f"messages[{i}].content must be a string or a list of text parts",
            f"messages[{i}].content",
        )
    out["content"] = content
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise bad_request(
                f"messages[{i}] (role tool) needs tool_call_id, the id of the call it answers",
                f"messages[{i}].tool_call_id",
            )
        out["tool_call_id"] = call_id
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    return out


def _list(calls: Any, i: int) -> list[Any]:
    if not isinstance(calls, list):
        raise bad_request(f"messages[{i}].tool_calls must be an array", f"messages[{i}].tool_calls")
    return calls


def _past_call(call: Any, i: int) -> dict[str, Any]:
    """An earlier call the assistant made, as OpenAI returned it."""
    function = call.get("function") if isinstance(call, dict) else None
    if not (
        isinstance(function, dict)
        and isinstance(call.get("id"), str)
        and call.get("type", "function") == "function"
        and isinstance(function.get("name"), str)
        and isinstance(function.get("arguments"), str)
    ):
        raise bad_request(
            f'messages[{i}].tool_calls must be [{{"id", "type": "function", '
            '"function": {"name", "arguments": JSON text}}]',
            f"messages[{i}].tool_calls",
        )
    function = {"name": function["name"], "arguments": function["arguments"]}
    return {"id": call["id"], "type": "function", "function": function}


def _max_tokens(body: dict[str, Any]) -> int | None:
    """None: up to the model's context."""
    # newer clients send max_completion_tokens for chat; either name works
    name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    tokens: int | None = number(body, name, int, None, low=BOUNDS["max_tokens"].low)
    return tokens


def _content(content: Any) -> str | None:
    """A message's text: a string, or OpenAI's list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    return None


def _prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise bad_request("prompt must be a non-empty string", "prompt")
    return prompt


def number(
    body: dict[str, Any],
    name: str,
    kind: type,
    default: Any,
    low: float | None = None,
    high: float | None = None,
    label: str | None = None,
) -> Any:
    """body[name] as `kind` within [low, high], or `default` where absent; otherwise a 400
    naming `label` (the field's own name unless told)."""
    label = label or name
    value = body.get(name)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and not isinstance(value, int))
    ):
        raise bad_request(f"{label} must be {'an integer' if kind is int else 'a number'}", label)
    if (low is not None and value < low) or (high is not None and value > high):
        high_text = high if high is not None else "inf"
        raise bad_request(f"{label} must be in [{low}, {high_text}]", label)
    return kind(value)


def _logit_bias(body: dict[str, Any]) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias}, bias in [-100, 100]; ids are checked against the vocabulary
    once the model is at hand."""
    bias = body.get("logit_bias")
    if bias is None:
        return ()
    message = (
        f'logit_bias must map token ids to numbers in {LOGIT_BIAS.describe()}, e.g. {{"42": -100}}'
    )
    if not isinstance(bias, dict) or len(bias) > _MAX_LOGIT_BIAS:
        raise bad_request(message, "logit_bias")
    out: dict[int, float] = {}
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isdigit()) or not (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and LOGIT_BIAS.low <= value <= LOGIT_BIAS.high
        ):
            raise bad_request(message, "logit_bias")
        out[int(key)] = float(value)
    return tuple(sorted(out.items()))


def _include_usage(body: dict[str, Any], stream: bool) -> bool:
    """stream_options.include_usage: a last chunk with empty choices and the usage."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise bad_request("stream_options is only allowed with stream: true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise bad_request(
            "stream_options may hold only include_usage, true or false", "stream_options"
        )
    if not isinstance(options.get("include_usage", False), bool):
        raise bad_request("stream_options.include_usage must be true or false", "stream_options")
    return bool(options.get("include_usage", False))


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    return stop_strings(body.get("stop"), "stop")


def stop_strings(stop: Any, label: str) -> tuple[str, ...]:
    """A string or a list of them (at most _MAX_STOP), or a 400 naming `label`."""
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or not all(isinstance(s, str) and s for s in stops)
        or len(stops) > _MAX_STOP
    ):
        raise bad_request(f"{label} must be a non-empty string or up to {_MAX_STOP} of them", label)
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise bad_request(f"a stop string may have up to {MAX_STOP_CHARS} characters", label)
    return tuple(stops)
