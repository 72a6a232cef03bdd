"""OpenAI-compatible /v1/chat/completions, /v1/completions and /v1/models."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any

from aiohttp import web

from swarm.api import errors
from swarm.api.activity import Tracker
from swarm.api.backend import Backend, Done, Generation, TextDelta, TokenLogprob
from swarm.api.errors import from_swarm_error, internal
from swarm.api.fields import parse_request, read_json
from swarm.api.guard import Guard
from swarm.api.tools import CallWatch, ToolCall, Tools
from swarm.errors import SwarmError
from swarm.schema import RequestRecord, to_json

log = logging.getLogger(__name__)
_INLINE_JSON = 64 * 1024  # bytes of a request body parsed on the event loop; longer, a thread


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

    async def _complete(self, http: web.Request, chat: bool) -> web.StreamResponse:
        """Malformed input fails first; then a busy node refuses before tokenizing anything
        (refusals stay cheap under overload); then a prompt too long for the context fails,
        all before a stream starts."""
        raw = await self.guard.read_body(http)
        # parsing a long body takes tens of ms: off the event loop, like tokenizing
        body = (
            await asyncio.to_thread(read_json, raw) if len(raw) > _INLINE_JSON else read_json(raw)
        )
        parsed = parse_request(body, self.backend, chat)
        async with self.guard.slot():
            try:
                generation = await self.backend.start(parsed.request)
            except SwarmError as e:
                raise from_swarm_error(e) from None
            chunks = _Chunks(self.backend.model_name, chat, parsed.include_usage, parsed.tools)
            chunks.logprobs = parsed.request.sampling.logprobs is not None
            tracker = Tracker(chunks.id, "chat" if chat else "completions", parsed.stream)
            try:
                if parsed.stream:
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
        text: list[str] = []
        logprobs: list[TokenLogprob] = []
        try:
            async with aclosing(generation.events()) as events:
                async for event in events:
                    tracker.saw(event)
                    if isinstance(event, TextDelta):
                        text.append(event.text)
                        logprobs.extend(event.logprobs)
                    if _gone(http):  # leaving the loop closes the session on every hop
                        tracker.outcome = "disconnected"
                        return web.Response(status=499)
        except SwarmError as e:
            tracker.outcome = "error"
            raise from_swarm_error(e) from None
        if tracker.done is None:
            raise internal("generation ended without finishing")
        answer = "".join(text)
        calls = chunks.tools.calls_in(answer) if chunks.tools else ()
        return web.json_response(chunks.whole(answer, logprobs, tracker.done, calls))

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
        watch = CallWatch(chunks.tools) if chunks.tools else None
        try:
            while event is not None:
                if _gone(http):
                    raise ConnectionResetError("the client went away")
                tracker.saw(event)
                if isinstance(event, TextDelta):
                    await _send_text(out, chunks, event if watch is None else watch.push(event))
                else:
                    held, calls = watch.finish() if watch else (None, ())
                    await _send_text(out, chunks, held)
                    if calls:
                        await _send(out, chunks.delta({"tool_calls": _indexed(calls)}, None))
                    await _send(out, chunks.final(event, calls))
                    if chunks.include_usage:
                        await _send(out, chunks.usage(event))
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


async def _send_text(out: web.StreamResponse, chunks: _Chunks, delta: TextDelta | None) -> None:
    if delta is not None and (delta.text or delta.logprobs):
        await _send(out, chunks.text(delta.text, None, delta.logprobs))


def _indexed(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """A stream's calls, each whole in one delta (the index says which call it is)."""
    return [call.to_json(index) for index, call in enumerate(calls)]


class _Chunks:
    def __init__(
        self, model: str, chat: bool, include_usage: bool = False, tools: Tools | None = None
    ) -> None:
        self.tools = tools  # where the request offers tools: answers may be calls
        self.include_usage = include_usage  # usage in a chunk of its own, as OpenAI sends it
        self.logprobs = False  # whether choices carry logprobs
        self._offset = 0  # characters of the answer so far: completions' text_offset
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.model = model
        self.chat = chat
        self.created = int(time.time())

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
            choice["logprobs"] = {"content": [_chat_logprob(lp) for lp in logprobs]}
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
        self,
        text: str,
        logprobs: Sequence[TokenLogprob],
        done: Done,
        calls: Sequence[ToolCall] = (),
    ) -> dict[str, Any]:
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


def _chat_logprob(lp: TokenLogprob) -> dict[str, Any]:
    def one(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {**one(lp.token, lp.logprob), "top_logprobs": [one(t, p) for t, p in lp.top]}


def _usage(done: Done) -> dict[str, int]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }
