"""Anthropic's `system` and `messages` as the chat template gets the OpenAI routes' messages:
text blocks joined into one content (a blank line between blocks), an assistant's tool_use
blocks as its tool_calls (the id, the name, the input as JSON text), and a user's tool_result
blocks as role "tool" messages answering the call of that id, in the order the blocks come.
A block of any other type is refused by name: the model reads text, and swarm runs no tools
of its own."""

from __future__ import annotations

import json
from typing import Any

from swarm.api.errors import bad_request

_ROLES = ("user", "assistant", "system")
_BLOCK_FIELDS = {
    # citations and cache_control change nothing here: swarm keeps prompt blocks on its own
    "text": frozenset({"type", "text", "cache_control", "citations"}),
    "tool_use": frozenset({"type", "id", "name", "input", "cache_control"}),
    "tool_result": frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"}),
}
# what may hold which blocks, and how an error names it
_HOLDS = {
    "user": ("a user message", frozenset({"text", "tool_result"})),
    "assistant": ("an assistant message", frozenset({"text", "tool_use"})),
    "system": ("a system prompt", frozenset({"text"})),
    "tool_result": ("a tool_result's content", frozenset({"text"})),
}
_WHY_NOT = {
    "image": "images are not supported: the model reads text only",
    "document": "documents are not supported: send their text as text blocks",
    "thinking": "thinking blocks are not supported: this server keeps no separate thinking",
    "redacted_thinking": "thinking blocks are not supported: this server keeps no separate "
    "thinking",
}
_TOOL_OF_ITS_OWN = "is not supported: this server runs no tools of its own"
_PARAGRAPH = "\n\n"


def system_prompt(system: Any) -> list[dict[str, Any]]:
    """The top-level `system` (a string or text blocks) as a system message, where given."""
    if system is None:
        return []
    text = _text(system, "system", "system")
    return [{"role": "system", "content": text}] if text else []


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages in the OpenAI routes' shape, or a 400 naming the one at fault."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty array of messages", "messages")
    last = messages[-1]
    if isinstance(last, dict) and last.get("role") == "assistant":
        raise bad_request(
            "a last assistant message (a prefilled answer) is not supported: the answer starts "
            "as a new assistant turn",
            f"messages[{len(messages) - 1}]",
        )
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_use ids so far, and the tool each called
    for i, m in enumerate(messages):
        out.extend(_message(m, f"messages[{i}]", names))
    return out


def _message(m: Any, where: str, names: dict[str, str]) -> list[dict[str, Any]]:
    role = m.get("role") if isinstance(m, dict) else None
    if role not in _ROLES:
        raise bad_request(f"{where}.role must be one of {', '.join(_ROLES)}", f"{where}.role")
    unknown = set(m) - {"role", "content"}
    if unknown:
        raise bad_request(f"unknown field {sorted(unknown)[0]!r} in {where}", where)
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    blocks = _blocks(content, f"{where}.content", role)
    if role == "assistant":
        return [_assistant(blocks, where, names)]
    if role == "system":
        return [{"role": "system", "content": _joined(blocks)}]
    return _user(blocks, where, names)


def _blocks(content: Any, where: str, holder: str) -> list[dict[str, Any]]:
    """Each block checked: a type this server reads, in a place (`holder`, a key of _HOLDS)
    that may hold it, and no field it does not know."""
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or an array of content blocks", where)
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str):
            raise bad_request(f"{at} must be a content block with a type", at)
        if kind not in _BLOCK_FIELDS:
            why = _WHY_NOT.get(kind, f"{kind} blocks {_TOOL_OF_ITS_OWN}")
            raise bad_request(f"{at}: {why}", f"{at}.type")
        what, holds = _HOLDS[holder]
        if kind not in holds:
            raise bad_request(f"{at}: {what} cannot hold {kind} blocks", f"{at}.type")
        unknown = set(block) - _BLOCK_FIELDS[kind]
        if unknown:
            raise bad_request(f"unknown field {sorted(unknown)[0]!r} in {at}", at)
        if kind == "text" and not isinstance(block.get("text"), str):
            raise bad_request(f"{at}.text must be a string", f"{at}.text")
    return content


def _joined(blocks: list[dict[str, Any]]) -> str:
    return _PARAGRAPH.join(b["text"] for b in blocks if b["type"] == "text")


def _text(content: Any, where: str, holder: str) -> str:
    """A string, or text blocks joined."""
    if isinstance(content, str):
        return content
    return _joined(_blocks(content, where, holder))


def _assistant(blocks: list[dict[str, Any]], where: str, names: dict[str, str]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": _joined(blocks)}
    calls = [
        _past_call(b, f"{where}.content[{j}]", names)
        for j, b in enumerate(blocks)
        if b["type"] == "tool_use"
    ]
    if calls:
        message["tool_calls"] = calls
    return message


def _past_call(block: dict[str, Any], at: str, names: dict[str, str]) -> dict[str, Any]:
    """An earlier tool_use, as the OpenAI routes take an earlier call."""
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not (isinstance(call_id, str) and call_id and isinstance(name, str)):
        raise bad_request(f"{at} must have a tool_use id and a tool name", at)
    if not isinstance(arguments, dict):
        raise bad_request(f"{at}.input must be an object", f"{at}.input")
    names[call_id] = name
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": call_id, "type": "function", "function": function}


def _user(blocks: list[dict[str, Any]], where: str, names: dict[str, str]) -> list[dict[str, Any]]:
    """Text blocks as a user turn, each tool_result as a tool message, in their order."""
    out: list[dict[str, Any]] = []
    text: list[str] = []
    for j, block in enumerate(blocks):
        if block["type"] == "text":
            text.append(block["text"])
            continue
        if text:
            out.append({"role": "user", "content": _PARAGRAPH.join(text)})
            text = []
        out.append(_result(block, f"{where}.content[{j}]", names))
    if text or not blocks:
        out.append({"role": "user", "content": _PARAGRAPH.join(text)})
    return out


def _result(block: dict[str, Any], at: str, names: dict[str, str]) -> dict[str, Any]:
    """A tool's result. Where it is an error, the text says so: a template has no field for
    it."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(f"{at}.tool_use_id must be the id of the tool_use it answers", at)
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise bad_request(f"{at}.is_error must be true or false", f"{at}.is_error")
    content = block.get("content", "")
    text = _text(content, f"{at}.content", "tool_result") if content is not None else ""
    message = {"role": "tool", "tool_call_id": call_id, "content": text}
    if is_error:
        message["content"] = f"Error: {text}"
    if call_id in names:
        message["name"] = names[call_id]
    return message
