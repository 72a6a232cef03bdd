"""Ollama's chat messages as the chat template gets the OpenAI routes' messages: an earlier
tool call gets an id and its arguments as JSON text, a tool's result the id of the call it
answers (Ollama's name the tool, not the call)."""

from __future__ import annotations

import json
from typing import Any

from swarm.api.errors import bad_request

NO_IMAGES = "images are not supported: the model reads text only"
_ROLES = ("system", "user", "assistant", "tool")
_MESSAGE_FIELDS = frozenset({"role", "content", "images", "thinking", "tool_calls", "tool_name"})


def chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """The messages in the OpenAI routes' shape, or a 400 naming the one at fault."""
    out: list[dict[str, Any]] = []
    calls: list[str] = []  # the ids of the last assistant message's calls, in order
    answered = 0  # tool results since that message
    for i, m in enumerate(messages):
        message = _message(m, i)
        if message.get("tool_calls"):
            calls, answered = [c["id"] for c in message["tool_calls"]], 0
        if message["role"] == "tool":
            # Ollama's results name the tool, not the call: the n-th result answers the n-th
            # call, and the tool's name stands in where the model made fewer calls
            name = message.get("name") or "call"
            message["tool_call_id"] = calls[answered] if answered < len(calls) else name
            answered += 1
        out.append(message)
    return out


def _message(m: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in _ROLES:
        raise bad_request(f"{where}.role must be one of {', '.join(_ROLES)}", f"{where}.role")
    unknown = set(m) - _MESSAGE_FIELDS
    if unknown:
        raise bad_request(f"unknown field {sorted(unknown)[0]!r} in {where}", where)
    if m.get("images"):
        raise bad_request(f"{where}.images: {NO_IMAGES}", f"{where}.images")
    if m.get("thinking"):
        raise bad_request(
            f"{where}.thinking is not supported: this server keeps no separate thinking",
            f"{where}.thinking",
        )
    content = m.get("content")
    if content is not None and not isinstance(content, str):
        raise bad_request(f"{where}.content must be a string", f"{where}.content")
    message: dict[str, Any] = {"role": m["role"], "content": content or ""}
    if m.get("tool_calls"):
        if m["role"] != "assistant":
            raise bad_request("only assistant messages have tool_calls", f"{where}.tool_calls")
        message["tool_calls"] = [_past_call(c, i, j) for j, c in enumerate(m["tool_calls"])]
    name = m.get("tool_name")
    if name is not None:
        if m["role"] != "tool" or not isinstance(name, str):
            raise bad_request(f"{where}.tool_name is a tool message's string", f"{where}.tool_name")
        message["name"] = name
    return message


def _past_call(call: Any, i: int, j: int) -> dict[str, Any]:
    """An earlier call, as Ollama returned it: {"function": {"name", "arguments": {...}}}."""
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments", {}) if isinstance(function, dict) else None
    if not (
        isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and isinstance(arguments, (dict, str))
    ):
        raise bad_request(
            f'messages[{i}].tool_calls must be [{{"function": {{"name", "arguments": {{...}}}}}}]',
            f"messages[{i}].tool_calls",
        )
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{i}_{j}"
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": function["name"], "arguments": text},
    }
