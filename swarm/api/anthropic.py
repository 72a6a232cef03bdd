"""Anthropic's Messages API: POST /v1/messages, answered as one message or streamed as
Anthropic's server-sent events (message_start, a content block's start, deltas and stop per
block, message_delta with the stop reason and usage, message_stop). The body becomes the
same GenerationRequest the OpenAI routes make (`swarm.api.anthropic_fields`) and runs through
the same path (`swarm.api.answers`); only the answer's shape is Anthropic's."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from swarm.api.activity import Timing
from swarm.api.answers import Answers
from swarm.api.anthropic_fields import parse_messages
from swarm.api.backend import Done, TextDelta, TokenLogprob
from swarm.api.errors import ApiError, anthropic_body
from swarm.api.tools import CallWatch, ToolCall, Tools
from swarm.schema import to_json


class AnthropicHandlers:
    def __init__(self, answers: Answers) -> None:
        self.answers = answers

    async def messages(self, http: web.Request) -> web.StreamResponse:
        """Malformed input fails first, before the guard's slot and the backend."""
        body = await self.answers.body(http)
        model = self.answers.backend.model_name
        parsed = parse_messages(body, model)
        answer = AnthropicAnswer(model, parsed.tools)
        return await self.answers.answer(http, parsed.request, parsed.stream, answer)


class AnthropicAnswer:
    """One request's answer in Anthropic's shapes (an `AnswerFormat`): text as one text block,
    or the calls an answer makes as tool_use blocks."""

    content_type = "text/event-stream"
    endpoint = "anthropic_messages"

    def __init__(self, model: str, tools: Tools | None = None) -> None:
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model = model
        self.tools = tools
        self._watch = CallWatch(tools) if tools else None  # a stream's possible call
        self._blocks = 0  # content blocks the stream has started
        self._text_open = False  # whether the stream's text block is open

    def opening(self, prompt_tokens: int) -> bytes:
        """The prompt's cached tokens are known only at the end: message_delta's usage has
        the counts as they finally are."""
        usage = {"input_tokens": prompt_tokens, "output_tokens": 0}
        message = {**self._message([], None, None), "usage": usage}
        return _event({"type": "message_start", "message": message})

    def part(self, delta: TextDelta) -> bytes:
        return self._text_event(delta if self._watch is None else self._watch.push(delta))

    def ending(self, done: Done, timing: Timing) -> bytes:
        held, calls = self._watch.finish() if self._watch else (None, ())
        out = self._text_event(held)
        if self._blocks == 0 and not calls:  # an empty answer is still one text block
            out += self._open_text()
        if self._text_open:
            out += self._stop()
        for call in calls:
            out += self._start({**_tool_use(call), "input": {}})
            delta = {"type": "input_json_delta", "partial_json": call.arguments}
            out += _event(self._delta(delta)) + self._stop()
        reason, sequence = _stop_reason(done, calls)
        event: dict[str, Any] = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": _usage(done),
        }
        if done.trace is not None:
            event["swarm"] = to_json(done.trace)
        return out + _event(event) + _event({"type": "message_stop"})

    def failure(self, error: ApiError) -> bytes:
        return _event(anthropic_body(error))

    def closing(self) -> bytes:
        return b""

    def whole(
        self, text: str, logprobs: Sequence[TokenLogprob], done: Done, timing: Timing
    ) -> dict[str, Any]:
        calls = self.tools.calls_in(text) if self.tools else ()
        content = [_tool_use(c) for c in calls] if calls else [{"type": "text", "text": text}]
        whole = {**self._message(content, *_stop_reason(done, calls)), "usage": _usage(done)}
        if done.trace is not None:
            whole["swarm"] = to_json(done.trace)
        return whole

    def _message(
        self, content: list[dict[str, Any]], reason: str | None, sequence: str | None
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
        }

    def _text_event(self, delta: TextDelta | None) -> bytes:
        if delta is None or not delta.text:
            return b""
        out = b"" if self._text_open else self._open_text()
        return out + _event(self._delta({"type": "text_delta", "text": delta.text}))

    def _open_text(self) -> bytes:
        self._text_open = True
        return self._start({"type": "text", "text": ""})

    def _start(self, block: dict[str, Any]) -> bytes:
        self._blocks += 1
        return _event({"type": "content_block_start", "index": self._index, "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self._index, "delta": delta}

    def _stop(self) -> bytes:
        self._text_open = False
        return _event({"type": "content_block_stop", "index": self._index})

    @property
    def _index(self) -> int:
        """The index of the block the stream has open."""
        return self._blocks - 1


def _event(payload: dict[str, Any]) -> bytes:
    """One server-sent event, named by its payload's type as Anthropic names each."""
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n".encode()


def _tool_use(call: ToolCall) -> dict[str, Any]:
    tool_id = "toolu_" + call.id.removeprefix("call_")
    return {
        "type": "tool_use",
        "id": tool_id,
        "name": call.name,
        "input": json.loads(call.arguments),
    }


def _stop_reason(done: Done, calls: Sequence[ToolCall]) -> tuple[str, str | None]:
    """Anthropic's stop_reason, and the stop sequence where one ended the text."""
    if calls:
        return "tool_use", None
    if done.stop_sequence is not None:
        return "stop_sequence", done.stop_sequence
    return ("max_tokens" if done.finish_reason == "length" else "end_turn"), None


def _usage(done: Done) -> dict[str, Any]:
    """As Anthropic counts: input_tokens are the prompt's tokens computed for this request, the
    prompt cache's are cache_read_input_tokens (OpenAI's prompt_tokens_details.cached_tokens)."""
    return {
        "input_tokens": done.prompt_tokens - done.cached_tokens,
        "output_tokens": done.completion_tokens,
        "cache_read_input_tokens": done.cached_tokens,
    }
