"""OpenAI-compatible /v1/chat/completions and /v1/completions: the body read into a
generation request, and the answer written as OpenAI's chunks (server-sent events, ending with
[DONE]) or one JSON body. Running the generation is `swarm.api.answers`'s."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from swarm.api import errors
from swarm.api.activity import Timing
from swarm.api.answers import Answers
from swarm.api.backend import Done, TextDelta, TokenLogprob
from swarm.api.errors import ApiError
from swarm.api.fields import parse_request
from swarm.api.tools import CallWatch, ToolCall, Tools
from swarm.schema import to_json


class CompletionHandlers:
    def __init__(self, answers: Answers) -> None:
        self.answers = answers

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _complete(self, http: web.Request, chat: bool) -> web.StreamResponse:
        """Malformed input fails first, before the guard's slot and the backend."""
        body = await self.answers.body(http)
        parsed = parse_request(body, self.answers.backend, chat)
        chunks = _Chunks(self.answers.backend.model_name, chat, parsed.include_usage, parsed.tools)
        chunks.logprobs = parsed.request.sampling.logprobs is not None
        return await self.answers.answer(http, parsed.request, parsed.stream, chunks)


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _indexed(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """A stream's calls, each whole in one delta (the index says which call it is)."""
    return [call.to_json(index) for index, call in enumerate(calls)]


class _Chunks:
    """One request's answer in OpenAI's shapes (an `AnswerFormat`)."""

    content_type = "text/event-stream"

    def __init__(
        self, model: str, chat: bool, include_usage: bool = False, tools: Tools | None = None
    ) -> None:
        self.tools = tools  # where the request offers tools: answers may be calls
        self._watch = CallWatch(tools) if tools else None  # a stream's possible call
        self.include_usage = include_usage  # usage in a chunk of its own, as OpenAI sends it
        self.logprobs = False  # whether choices carry logprobs
        self._offset = 0  # characters of the answer so far: completions' text_offset
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.endpoint = "chat" if chat else "completions"
        self.model = model
        self.chat = chat
        self.created = int(time.time())

    def opening(self, prompt_tokens: int) -> bytes:
        return _sse(self.delta({"role": "assistant", "content": ""}, None)) if self.chat else b""

    def part(self, delta: TextDelta) -> bytes:
        return self._text_event(delta if self._watch is None else self._watch.push(delta))

    def ending(self, done: Done, timing: Timing) -> bytes:
        held, calls = self._watch.finish() if self._watch else (None, ())
        out = self._text_event(held)
        if calls:
            out += _sse(self.delta({"tool_calls": _indexed(calls)}, None))
        out += _sse(self.final(done, calls))
        if self.include_usage:
            out += _sse(self.usage(done))
        return out

    def failure(self, error: ApiError) -> bytes:
        return _sse(errors.body(error))

    def closing(self) -> bytes:
        return b"data: [DONE]\n\n"

    def _text_event(self, delta: TextDelta | None) -> bytes:
        if delta is None or not (delta.text or delta.logprobs):
            return b""
        return _sse(self.text(delta.text, None, delta.logprobs))

    def _base(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def delta(
        self, delta: dict[str, Any], finish: str | None, logprobs: Sequence[TokenLogprob] = ()
    ) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {**self._base("chat.completion.chunk"), "choices": [self._with(choice, logprobs)]}

    def text(
        self, text: str, finish: str | None, logprobs: Sequence[TokenLogprob] = ()
    ) -> dict[str, Any]:
        if self.chat:
            return self.delta({"content": text}, finish, logprobs)
        choice = {"index": 0, "text": text, "finish_reason": finish}
        return {**self._base("text_completion"), "choices": [self._with(choice, logprobs)]}

    def _with(self, choice: dict[str, Any], logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        """The choice with OpenAI's logprobs, where asked: chat's `content` list, or
        completions' parallel lists."""
        if not self.logprobs:
            return choice
        if self.chat:
            choice["logprobs"] = {"content": [lp.to_json() for lp in logprobs]}
            return choice
        offsets = []
        for lp in logprobs:
            offsets.append(self._offset)
            self._offset += len(lp.token)
        choice["logprobs"] = {
            "tokens": [lp.token for lp in logprobs],
            "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [dict(lp.top) for lp in logprobs],
            "text_offset": offsets,
        }
        return choice

    def final(self, done: Done, calls: Sequence[ToolCall] = ()) -> dict[str, Any]:
        finish = "tool_calls" if calls else done.finish_reason
        chunk = self.delta({}, finish) if self.chat else self.text("", finish)
        if not self.include_usage:
            chunk["usage"] = _usage(done)
        if done.trace is not None:
            chunk["swarm"] = to_json(done.trace)
        return chunk

    def usage(self, done: Done) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._base(kind), "choices": [], "usage": _usage(done)}

    def whole(
        self, text: str, logprobs: Sequence[TokenLogprob], done: Done, timing: Timing
    ) -> dict[str, Any]:
        calls = self.tools.calls_in(text) if self.tools else ()
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": None if calls else text}
            if calls:
                message["tool_calls"] = [call.to_json() for call in calls]
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else done.finish_reason,
            }
            choice = self._with(choice, logprobs)
            whole = {**self._base("chat.completion"), "choices": [choice], "usage": _usage(done)}
        else:
            choice = {"index": 0, "text": text, "finish_reason": done.finish_reason}
            choice = self._with(choice, logprobs)
            whole = {**self._base("text_completion"), "choices": [choice], "usage": _usage(done)}
        if done.trace is not None:
            whole["swarm"] = to_json(done.trace)
        return whole


def _usage(done: Done) -> dict[str, Any]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        # as OpenAI names it: the prompt tokens computed by an earlier request
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    }
