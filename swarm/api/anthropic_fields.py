"""Anthropic's /v1/messages body into a GenerationRequest, the one the OpenAI routes make, so
every API runs one generation path.

As on the other routes, every field is honoured or refused with a 400 that names it. A few
change nothing about the text and are accepted and dropped (`metadata`, an id;
`service_tier`; `cache_control`, since swarm keeps prompt blocks on its own); `thinking` is
accepted only as disabled; the server-side features of Anthropic's API (`container`,
`mcp_servers`, `context_management`, server tools) are refused by name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from swarm.api.anthropic_messages import chat_messages, system_prompt
from swarm.api.backend import GenerationRequest
from swarm.api.errors import bad_request
from swarm.api.fields import number, setting, stop_strings
from swarm.api.tools import ChoiceMode, Tools, check_function, offer
from swarm.errors import SamplingError
from swarm.sampling_settings import BOUNDS, SamplingSettings

_FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "stop_sequences",
        "temperature",
        "top_k",
        "top_p",
        "stream",
        "tools",
        "tool_choice",
        "thinking",
    }
)
_DROPPED = frozenset({"metadata", "service_tier", "cache_control"})
_NOT_SUPPORTED = {
    "container": "container is not supported: this server runs no code execution",
    "mcp_servers": "mcp_servers is not supported: this server calls no tools of its own",
    "context_management": "context_management is not supported: swarm never edits the "
    "conversation it is sent",
    "output_config": "output_config is not supported yet by this server",
    "output_format": "output_format is not supported yet by this server",
}
_TOOL_FIELDS = frozenset({"type", "name", "description", "input_schema", "cache_control", "strict"})
_CHOICES: dict[str, ChoiceMode] = {
    "auto": "auto",
    "any": "required",
    "tool": "named",
    "none": "none",
}


@dataclass(frozen=True)
class AnthropicRequest:
    request: GenerationRequest
    stream: bool
    tools: Tools | None  # where the request offers tools: answers may be tool_use blocks


def parse_messages(body: dict[str, Any], served: str) -> AnthropicRequest:
    """The request, or an ApiError naming the bad field."""
    _refuse_unknown(body)
    _model(body, served)
    messages = system_prompt(body.get("system")) + chat_messages(body.get("messages"))
    tools = _tools(body)
    request = GenerationRequest(
        messages=messages,
        prompt=None,
        sampling=_sampling(body, tools),
        tools=None if tools is None else tools.rendered,
    )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("stream must be true or false", "stream")
    return AnthropicRequest(request, stream, tools)


def _refuse_unknown(body: dict[str, Any]) -> None:
    for name in body:
        if name in _NOT_SUPPORTED:
            raise bad_request(_NOT_SUPPORTED[name], name)
        if name not in _FIELDS and name not in _DROPPED:
            raise bad_request(f"unknown field {name!r}", name)
    thinking = body.get("thinking")
    if thinking is not None and thinking != {"type": "disabled"}:
        raise bad_request(
            'thinking is not supported: this server streams no separate thinking (only {"type": '
            '"disabled"})',
            "thinking",
        )


def _model(body: dict[str, Any], served: str) -> None:
    """Anthropic's API needs the model named; which one it is, and whether the swarm serves
    it, the router decided before the body got here (`api/model_routes.py`)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request(f"model is required: the name of the model ({served!r})", "model")


def _sampling(body: dict[str, Any], tools: Tools | None) -> SamplingSettings:
    """Anthropic's defaults are OpenAI's: temperature 1, no top_p or top_k."""
    if body.get("max_tokens") is None:
        raise bad_request(
            "max_tokens is required: the most tokens the answer may have", "max_tokens"
        )
    try:
        return SamplingSettings(
            max_tokens=number(body, "max_tokens", int, None, low=BOUNDS["max_tokens"].low),
            temperature=setting(body, "temperature", float, 1.0),
            top_p=setting(body, "top_p", float, 1.0),
            top_k=setting(body, "top_k", int, 0),
            stop=_stop_sequences(body.get("stop_sequences")),
            grammar=None if tools is None else tools.grammar(),
        )
    except SamplingError as e:
        raise bad_request(str(e), e.param) from None


def _stop_sequences(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad_request("stop_sequences must be an array of strings", "stop_sequences")
    return stop_strings(value, "stop_sequences") if value else ()


def _tools(body: dict[str, Any]) -> Tools | None:
    """Anthropic's tools as OpenAI's function definitions, and tool_choice as its mode:
    "any" is OpenAI's "required", "tool" a named function."""
    definitions, choice = body.get("tools"), body.get("tool_choice")
    if definitions is not None and not isinstance(definitions, list):
        raise bad_request("tools must be an array of tools", "tools")
    mode, named, parallel = _choice(choice)
    if not definitions:
        if mode != "none" and choice is not None:
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    checked = tuple(_definition(d, f"tools[{i}]") for i, d in enumerate(definitions))
    return offer(checked, mode, named, parallel)


def _definition(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise bad_request(f'{where} must be {{"name", "description", "input_schema"}}', "tools")
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise bad_request(
            f"{where}: {kind} is one of Anthropic's server tools, which this server does not run",
            "tools",
        )
    unknown = set(tool) - _TOOL_FIELDS
    if unknown:
        raise bad_request(f"unknown field {sorted(unknown)[0]!r} in {where}", "tools")
    schema = tool.get("input_schema")
    if schema is None:
        raise bad_request(f"{where}.input_schema is required: a JSON schema object", "tools")
    check_function(tool.get("name"), tool.get("description", ""), schema, where, "input_schema")
    function = {"name": tool["name"], "parameters": schema}
    if "description" in tool:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _choice(choice: Any) -> tuple[ChoiceMode, str | None, bool]:
    """(mode, the tool it names, whether several calls may come)."""
    if choice is None:
        return "auto", None, True
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in _CHOICES or set(choice) - {"type", "name", "disable_parallel_tool_use"}:
        raise bad_request(
            'tool_choice must be {"type": "auto"}, {"type": "any"}, {"type": "tool", "name": '
            '...} or {"type": "none"}',
            "tool_choice",
        )
    name = choice.get("name")
    if (kind == "tool") != isinstance(name, str):
        raise bad_request('tool_choice names a tool with {"type": "tool"} only', "tool_choice")
    single = choice.get("disable_parallel_tool_use", False)
    if not isinstance(single, bool):
        raise bad_request(
            "tool_choice.disable_parallel_tool_use must be true or false", "tool_choice"
        )
    return _CHOICES[kind], name, not single
