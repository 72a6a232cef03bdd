"""OpenAI's function tools: checking `tools`, `tool_choice` and `parallel_tool_calls`, the
grammar that makes a call the only possible answer (tool_choice required or a named function),
and finding the calls in a model's answer. Anthropic's tools become the same definitions
(`check_function`, `offer`), so every API's calls go one way.

A model answers a call as `{"name": ..., "arguments": {...}}`: bare (Llama 3.1's form, and what
the generic prompt asks of a template that knows no tools), inside `<tool_call>` tags (Hermes'
and Qwen's), or in a ```json fence; several calls as several tags or a JSON list. The call
must open the answer: text before it makes the whole answer plain content, so a stream can
pass text on at once and holds back only an answer that starts like a call."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from swarm.api.backend import TextDelta, TokenLogprob
from swarm.api.errors import bad_request
from swarm.api.formats import json_grammar

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
_FUNCTION_FIELDS = frozenset({"name", "description", "parameters", "strict"})
_CALL_OPENINGS = ("{", "[", "<tool_call>", "```")
_ANY_ARGUMENTS: dict[str, Any] = {"type": "object"}
ChoiceMode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object as text, as OpenAI sends it

    def to_json(self, index: int | None = None) -> dict[str, Any]:
        call = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


@dataclass(frozen=True)
class Tools:
    definitions: tuple[dict[str, Any], ...]  # OpenAI's {"type": "function", "function": {...}}
    choice: ChoiceMode
    named: str | None = None  # the function tool_choice names
    parallel: bool = True  # False: at most one call per answer

    @property
    def names(self) -> frozenset[str]:
        return frozenset(d["function"]["name"] for d in self.definitions)

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "named")

    @property
    def rendered(self) -> tuple[dict[str, Any], ...] | None:
        """What the prompt shows the model: nothing when it must not call a tool."""
        return None if self.choice == "none" else self.definitions

    def grammar(self) -> str | None:
        """Where a call is required: JSON of one call to one of the allowed functions."""
        if not self.forced:
            return None
        allowed = [
            d["function"]
            for d in self.definitions
            if self.choice == "required" or d["function"]["name"] == self.named
        ]
        calls = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": f["name"]},
                    "arguments": f.get("parameters") or _ANY_ARGUMENTS,
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for f in allowed
        ]
        schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
        return json_grammar(schema, "tools", "a tool's parameters schema")

    def calls_in(self, text: str) -> tuple[ToolCall, ...]:
        """The calls the answer makes; none when it is not wholly a call to a known tool."""
        if self.choice == "none":
            return ()
        values: list[Any] = []
        for part in _call_texts(text.strip()):
            try:
                value = json.loads(part)
            except json.JSONDecodeError:
                return ()
            values.extend(value if isinstance(value, list) else [value])
        calls = [self._call(v) for v in values]
        if not calls or any(c is None for c in calls):
            return ()
        found = tuple(c for c in calls if c is not None)
        return found if self.parallel else found[:1]

    def _call(self, value: Any) -> ToolCall | None:
        if not isinstance(value, dict) or value.get("name") not in self.names:
            return None
        arguments = value.get("arguments", value.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None
        if not isinstance(arguments, dict):
            return None
        return ToolCall(f"call_{uuid.uuid4().hex[:24]}", value["name"], json.dumps(arguments))


def _call_texts(text: str) -> list[str]:
    if text.startswith("<tool_call>"):
        return [part.split("</tool_call>")[0].strip() for part in text.split("<tool_call>")[1:]]
    if text.startswith("```"):
        inner = text[3:].removesuffix("```")
        return [inner.split("\n", 1)[1] if inner.startswith("json") else inner]
    return [text]


def parse_tools(body: dict[str, Any]) -> Tools | None:
    """`tools`, `tool_choice` and `parallel_tool_calls`, or a 400 naming the bad one."""
    definitions, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls must be true or false", "parallel_tool_calls")
    if definitions is None:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(definitions, list) or not definitions:
        raise bad_request("tools must be a non-empty array of function tools", "tools")
    checked = tuple(_definition(d, i) for i, d in enumerate(definitions))
    mode, named = _choice(choice)
    return offer(checked, mode, named, parallel is not False)


def offer(
    definitions: tuple[dict[str, Any], ...],
    choice: ChoiceMode,
    named: str | None = None,
    parallel: bool = True,
) -> Tools:
    """The tools a request offers (checked definitions, OpenAI's shape), whichever API it
    came by: a 400 where two share a name or tool_choice names none of them."""
    names = [d["function"]["name"] for d in definitions]
    if len(set(names)) != len(names):
        raise bad_request("tools must have distinct function names", "tools")
    if named is not None and named not in names:
        raise bad_request(f"tool_choice names {named!r}, which is not in tools", "tool_choice")
    return Tools(definitions, choice, named, parallel)


def check_function(name: Any, description: Any, schema: Any, where: str, schema_field: str) -> None:
    """A function's name, description and arguments' schema, or a 400 naming the one at fault
    as the request's own API names it (`where`: the tool, `schema_field`: its schema)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad_request(f"{where}.name must match {_NAME.pattern}", "tools")
    if not isinstance(description, str):
        raise bad_request(f"{where}.description must be a string", "tools")
    if schema is not None:
        json_grammar(schema, "tools", f"{where}.{schema_field}")


def _definition(value: Any, index: int) -> dict[str, Any]:
    function = value.get("function") if isinstance(value, dict) else None
    if (
        not isinstance(function, dict)
        or value.get("type") != "function"
        or set(value) - {"type", "function"}
    ):
        raise bad_request(
            f'tools[{index}] must be {{"type": "function", "function": {{"name": ...}}}}', "tools"
        )
    unknown = set(function) - _FUNCTION_FIELDS
    if unknown:
        raise bad_request(f"unknown field {sorted(unknown)[0]!r} in tools[{index}]", "tools")
    where = f"tools[{index}].function"
    description, parameters = function.get("description", ""), function.get("parameters")
    check_function(function.get("name"), description, parameters, where, "parameters")
    return {"type": "function", "function": function}


def _choice(choice: Any) -> tuple[ChoiceMode, str | None]:
    if choice is None or choice == "auto":
        return "auto", None
    if choice in ("none", "required"):
        return choice, None
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or choice.get("type") != "function":
        raise bad_request(
            'tool_choice must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    return "named", name


@dataclass
class CallWatch:
    """A stream's view of a possible call: text passes on at once unless the answer so far
    could still be a call, which is held back until the answer ends."""

    tools: Tools
    _held: list[TextDelta] = field(default_factory=list)
    _content: bool = False  # decided: the answer is plain text

    def push(self, delta: TextDelta) -> TextDelta | None:
        """What to send now, if anything."""
        if self._content:
            return delta
        self._held.append(delta)
        lead = "".join(d.text for d in self._held).lstrip()
        if self.tools.choice == "none" or (
            lead
            and not self.tools.forced
            and not any(lead.startswith(o) or o.startswith(lead) for o in _CALL_OPENINGS)
        ):
            self._content = True
            return self._release()
        return None

    def finish(self) -> tuple[TextDelta | None, tuple[ToolCall, ...]]:
        """At the answer's end: the held text, or the calls it made."""
        if self._content or not self._held:
            return None, ()
        calls = self.tools.calls_in("".join(d.text for d in self._held))
        return (None, calls) if calls else (self._release(), ())

    def _release(self) -> TextDelta:
        held, self._held = self._held, []
        logprobs: list[TokenLogprob] = [lp for d in held for lp in d.logprobs]
        return TextDelta("".join(d.text for d in held), tuple(logprobs))
