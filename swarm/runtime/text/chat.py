"""Chat messages (OpenAI's shape: roles system, developer, user, assistant, tool; assistant
tool calls) and tool definitions rendered into a prompt through the model's chat template.

A template that knows tools (its source mentions `tools`, as Llama 3.1's, Qwen 2.5's and
Hermes' do) gets them as the template's `tools`, with the messages as transformers documents
them. A template that does not (SmolLM2's) gets the generic form, as
llama.cpp's server does for such models: the tool schemas and how to call one go into the
system prompt, an earlier call is written back as the JSON object the model was asked for, and
a tool's result becomes a user turn. Either way a model answers a call as
`{"name": ..., "arguments": {...}}` (bare, or inside `<tool_call>` tags), which the API layer
parses; with tool_choice required or named, a grammar makes it the only possible answer.

A role the template refuses (it raises, as strict templates do) is a SamplingError naming
`messages`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from swarm.errors import SamplingError
from swarm.runtime.text.tokenizer import Tokenizer

Message = dict[str, Any]

GENERIC_INSTRUCTIONS = (
    "You can call these tools, described as JSON schemas:\n{tools}\n"
    "To call a tool, answer with only a JSON object of this form and nothing else: "
    '{{"name": "<tool name>", "arguments": {{<the arguments>}}}}. '
    "When a tool's result is given, use it to answer."
)


def knows_tools(template: str) -> bool:
    return "tools" in template


def render_chat(
    tokenizer: Tokenizer, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None
) -> list[int]:
    """Token ids of the conversation, ending where the assistant's answer begins."""
    template = str(tokenizer.chat_template)
    developer_known = "developer" in template
    turns = [
        {**m, "role": "system"} if m["role"] == "developer" and not developer_known else dict(m)
        for m in messages
    ]
    if knows_tools(template):
        turns, extra = [_native(m) for m in turns], {"tools": list(tools)} if tools else {}
    else:
        turns, extra = _generic(turns, tools), {}
    try:
        return tokenizer.chat_ids(turns, extra)
    except Exception as e:  # jinja's TemplateError and whatever the template raises
        raise SamplingError(
            f"the model's chat template refused the messages: {e}", "messages"
        ) from None


def _native(message: Message) -> Message:
    """Transformers' templates read a call's arguments as a mapping, OpenAI sends a string."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for call in calls:
        function = dict(call["function"])
        function["arguments"] = _arguments(function.get("arguments"))
        out.append({**call, "function": function})
    return {**message, "tool_calls": out, "content": message.get("content") or ""}


def _generic(messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None) -> list[Message]:
    turns: list[Message] = []
    for m in messages:
        if m["role"] == "tool":
            result = f"Result of tool call {m.get('tool_call_id', '')}:\n{m.get('content', '')}"
            turns.append({"role": "user", "content": result})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            calls = [
                json.dumps(
                    {
                        "name": c["function"]["name"],
                        "arguments": _arguments(c["function"].get("arguments")),
                    }
                )
                for c in m["tool_calls"]
            ]
            text = "\n".join(filter(None, [m.get("content") or "", *calls]))
            turns.append({"role": "assistant", "content": text})
        else:
            turns.append({"role": m["role"], "content": m.get("content") or ""})
    if tools:
        described = "\n".join(json.dumps(t.get("function", t)) for t in tools)
        prompt = GENERIC_INSTRUCTIONS.format(tools=described)
        if turns and turns[0]["role"] == "system":
            turns[0] = {**turns[0], "content": f"{turns[0]['content']}\n\n{prompt}"}
        else:
            turns.insert(0, {"role": "system", "content": prompt})
    return turns


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return raw
    return raw if raw is not None else {}
