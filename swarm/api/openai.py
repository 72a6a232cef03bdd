"""OpenAI-compatible /v1/chat/completions, /v1/completions and /v1/models."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from aiohttp import web

from swarm.api import errors
from swarm.api.activity import Tracker
from swarm.api.backend import Backend, Done, Generation, GenerationRequest, TextDelta
from swarm.api.errors import ApiError, bad_request, from_swarm_error, internal
from swarm.api.guard import Guard
from swarm.errors import SwarmError
from swarm.schema import RequestRecord, to_json

log = logging.getLogger(__name__)

_ROLES = ("system", "user", "assistant")
_MAX_STOP = 4
DEFAULT_MAX_TOKENS = 256


def read_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise bad_request("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def parse_request(
    body: dict[str, Any], backend: Backend, chat: bool
) -> tuple[GenerationRequest, bool]:
    """(request, stream) or ApiError naming the bad field."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string", "model")
    if model is not None and model != backend.model_name:
        raise ApiError(
            404,
            f"model {model!r} does not exist; this swarm serves {backend.model_name!r}",
            "model",
            "not_found_error",
        )
    if body.get("n", 1) != 1:
        raise bad_request("only n = 1 is supported", "n")
    messages, prompt = (_messages(body), None) if chat else (None, _prompt(body))
    request = GenerationRequest(
        messages=messages,
        prompt=prompt,
        max_tokens=_max_tokens(body),
        temperature=_number(body, "temperature", float, 1.0, low=0.0, high=2.0),
        top_p=_number(body, "top_p", float, 1.0, low=0.0, high=1.0),
        top_k=_number(body, "top_k", int, 0, low=0),
        repetition_penalty=_repetition_penalty(body),
        seed=_number(body, "seed", int, None),
        stop=_stop(body),
    )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("stream must be true or false", "stream")
    return request, stream


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(messages):
        content = _content(m.get("content")) if isinstance(m, dict) else None
        if content is None or m.get("role") not in _ROLES:
            raise bad_request(
                f"messages[{i}] must be {{role: system|user|assistant, content: string}}",
                "messages",
            )
        out.append({"role": m["role"], "content": content})
    return out


def _max_tokens(body: dict[str, Any]) -> int:
    # newer clients send max_completion_tokens for chat; either name works
    name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    tokens: int = _number(body, name, int, DEFAULT_MAX_TOKENS, low=1)
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


def _number(
    body: dict[str, Any],
    name: str,
    kind: type,
    default: Any,
    low: float | None = None,
    high: float | None = None,
) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and not isinstance(value, int))
    ):
        raise bad_request(f"{name} must be {'an integer' if kind is int else 'a number'}", name)
    if (low is not None and value < low) or (high is not None and value > high):
        raise bad_request(f"{name} must be in [{low}, {high if high is not None else 'inf'}]", name)
    return kind(value)


def _repetition_penalty(body: dict[str, Any]) -> float:
    if body.get("repetition_penalty") is not None:
        penalty: float = _number(body, "repetition_penalty", float, 1.0, low=0.01, high=10.0)
        return penalty
    # OpenAI's frequency_penalty in [-2, 2] maps onto a multiplicative penalty around 1.
    frequency = _number(body, "frequency_penalty", float, 0.0, low=-2.0, high=2.0)
    return float(1.0 + frequency / 2.0) if frequency > 0 else 1.0


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or not all(isinstance(s, str) and s for s in stops)
        or len(stops) > _MAX_STOP
    ):
        raise bad_request(f"stop must be a non-empty string or up to {_MAX_STOP} of them", "stop")
    return tuple(stops)


class CompletionHandlers:
    def __init__(
        self, backend: Backend, guard: Guard, finished: Callable[[RequestRecord], None]
    ) -> None:
        self.backend = backend
        self.guard = guard
        self._finished = finished  # every generation that started, however it ended

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def models(self, request: web.Request) -> web.Response:
        model = {
            "id": self.backend.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "swarm",
        }
        return web.json_response({"object": "list", "data": [model]})

    async def _complete(self, http: web.Request, chat: bool) -> web.StreamResponse:
        """Malformed input fails first; then a busy node refuses before tokenizing anything
        (refusals stay cheap under overload); then a prompt too long for the context fails,
        all before a stream starts."""
        request, stream = parse_request(
            read_json(await self.guard.read_body(http)), self.backend, chat
        )
        with self.guard.slot():
            try:
                generation = await self.backend.start(request)
            except SwarmError as e:
                raise from_swarm_error(e) from None
            chunks = _Chunks(self.backend.model_name, chat)
            tracker = Tracker(chunks.id, "chat" if chat else "completions", stream)
            try:
                if stream:
                    return await self._stream(http, generation, chunks, tracker)
                return await self._whole(http, generation, chunks, tracker)
            except asyncio.CancelledError:  # a server run with handler_cancellation
                tracker.outcome = "disconnected"
                raise
            finally:
                self._finished(tracker.record(generation.prompt_tokens))

    async def _whole(
        self, http: web.Request, generation: Generation, chunks: _Chunks, tracker: Tracker
    ) -> web.StreamResponse:
        text = []
        try:
            async with aclosing(generation.events()) as events:
                async for event in events:
                    tracker.saw(event)
                    if isinstance(event, TextDelta):
                        text.append(event.text)
                    if _gone(http):  # leaving the loop closes the session on every hop
                        tracker.outcome = "disconnected"
                        return web.Response(status=499)
        except SwarmError as e:
            tracker.outcome = "error"
            raise from_swarm_error(e) from None
        if tracker.done is None:
            raise internal("generation ended without finishing")
        return web.json_response(chunks.whole("".join(text), tracker.done))

    async def _stream(
        self, http: web.Request, generation: Generation, chunks: _Chunks, tracker: Tracker
    ) -> web.StreamResponse:
        """Server-sent events, ending with [DONE]. A client that goes away ends the loop at
        its next event; closing the generator then closes the session on every hop."""
        out = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        async with aclosing(generation.events()) as events:
            try:
                event = await anext(events, None)
            except SwarmError as e:  # nothing sent yet: a plain error response
                tracker.outcome = "error"
                raise from_swarm_error(e) from None
            try:
                await out.prepare(http)
                if chunks.chat:
                    await _send(out, chunks.delta({"role": "assistant", "content": ""}, None))
                await self._relay(http, out, event, events, chunks, tracker)
                await out.write(b"data: [DONE]\n\n")
                await out.write_eof()
            except ConnectionResetError:
                tracker.outcome = "disconnected"
        return out

    async def _relay(
        self,
        http: web.Request,
        out: web.StreamResponse,
        event: TextDelta | Done | None,
        events: AsyncIterator[TextDelta | Done],
        chunks: _Chunks,
        tracker: Tracker,
    ) -> None:
        try:
            while event is not None:
                if _gone(http):
                    raise ConnectionResetError("the client went away")
                tracker.saw(event)
                if isinstance(event, TextDelta):
                    if event.text:
                        await _send(out, chunks.text(event.text, None))
                else:
                    await _send(out, chunks.final(event))
                event = await anext(events, None)
        except SwarmError as e:  # the stream has started: the error is its last event
            tracker.outcome = "error"
            await _send(out, errors.body(from_swarm_error(e)))
        except ConnectionResetError:
            raise
        except Exception:
            log.exception("generation failed mid-stream")
            tracker.outcome = "error"
            await _send(out, errors.body(internal("generation failed; see the node's log")))


def _gone(http: web.Request) -> bool:
    transport = http.transport
    return transport is None or transport.is_closing()


async def _send(out: web.StreamResponse, payload: dict[str, Any]) -> None:
    await out.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


class _Chunks:
    def __init__(self, model: str, chat: bool) -> None:
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.model = model
        self.chat = chat
        self.created = int(time.time())

    def _base(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def delta(self, delta: dict[str, str], finish: str | None) -> dict[str, Any]:
        return {
            **self._base("chat.completion.chunk"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def text(self, text: str, finish: str | None) -> dict[str, Any]:
        if self.chat:
            return self.delta({"content": text}, finish)
        return {
            **self._base("text_completion"),
            "choices": [{"index": 0, "text": text, "finish_reason": finish}],
        }

    def final(self, done: Done) -> dict[str, Any]:
        chunk = (
            self.delta({}, done.finish_reason) if self.chat else self.text("", done.finish_reason)
        )
        chunk["usage"] = _usage(done)
        if done.trace is not None:
            chunk["swarm"] = to_json(done.trace)
        return chunk

    def whole(self, text: str, done: Done) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": done.finish_reason,
            }
            whole = {**self._base("chat.completion"), "choices": [choice], "usage": _usage(done)}
        else:
            choice = {"index": 0, "text": text, "finish_reason": done.finish_reason}
            whole = {**self._base("text_completion"), "choices": [choice], "usage": _usage(done)}
        if done.trace is not None:
            whole["swarm"] = to_json(done.trace)
        return whole


def _usage(done: Done) -> dict[str, int]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }
