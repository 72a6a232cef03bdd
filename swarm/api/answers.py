"""One generation answered over HTTP, whichever API asked for it: a slot from the guard, the
backend's generation, the answer whole or streamed, a client that goes away, errors before
and during a stream, and the record /status and /metrics keep. Each API (OpenAI's, Ollama's,
Anthropic's) only says how its answer is written: an `AnswerFormat`."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any, Protocol

from aiohttp import web

from swarm.api.activity import Timing, Tracker
from swarm.api.backend import (
    Backend,
    Done,
    EmbeddingRequest,
    Embeddings,
    Generation,
    GenerationRequest,
    TextDelta,
    TokenLogprob,
)
from swarm.api.errors import ApiError, from_swarm_error, internal
from swarm.api.fields import read_json
from swarm.api.guard import Guard
from swarm.errors import SwarmError
from swarm.schema import RequestRecord

log = logging.getLogger(__name__)
_INLINE_JSON = 64 * 1024  # bytes of a request body parsed on the event loop; longer, a thread
# where `Answers.body` keeps a request's body, as it came and parsed
_RAW = web.RequestKey("swarm.body", bytes)
_PARSED = web.RequestKey("swarm.json", dict[str, Any])


class AnswerFormat(Protocol):
    """How one API writes one request's answer. A streamed answer is `opening` (told the
    prompt's tokens), a `part` per text delta, `ending` at the generation's end (or `failure`
    when it fails mid-stream), then `closing`; each returns the bytes to send, empty for
    nothing (a part held back)."""

    id: str  # the request's id, as the answer and /status carry it
    endpoint: str  # what /status and /metrics call the route
    content_type: str  # of a streamed answer

    def opening(self, prompt_tokens: int) -> bytes: ...

    def part(self, delta: TextDelta) -> bytes: ...

    def ending(self, done: Done, timing: Timing) -> bytes: ...

    def failure(self, error: ApiError) -> bytes: ...

    def closing(self) -> bytes: ...

    def whole(
        self, text: str, logprobs: Sequence[TokenLogprob], done: Done, timing: Timing
    ) -> dict[str, Any]:
        """The answer as one JSON body."""
        ...


class Answers:
    def __init__(
        self, backend: Backend, guard: Guard, finished: Callable[[RequestRecord], None]
    ) -> None:
        self.backend = backend
        self.guard = guard
        self._finished = finished  # every generation that started, however it ended

    async def body(self, http: web.Request) -> dict[str, Any]:
        """The request's JSON object, or a 400/408/413 before anything else happens. Read
        once: the model's router reads it before the route's handler does."""
        if _PARSED in http:
            return http[_PARSED]
        raw = await self.guard.read_body(http)
        # parsing a long body takes tens of ms: off the event loop, like tokenizing
        if len(raw) > _INLINE_JSON:
            parsed = await asyncio.to_thread(read_json, raw)
        else:
            parsed = read_json(raw)
        http[_RAW], http[_PARSED] = raw, parsed
        return parsed

    @staticmethod
    def raw_body(http: web.Request) -> bytes:
        """The bytes `body` read, as they came."""
        return http[_RAW]

    async def embeddings(self, request: EmbeddingRequest, endpoint: str) -> Embeddings:
        """A slot from the guard, the backend's vectors, and the record /status keeps."""
        async with self.guard.slot():
            tracker = Tracker("embd-" + uuid.uuid4().hex[:24], endpoint, stream=False)
            tracker.outcome = "error"
            tokens = 0
            try:
                done = await self.backend.embed(request)
                tracker.outcome, tokens = "stop", done.prompt_tokens
                return done
            except SwarmError as e:
                raise from_swarm_error(e, self.backend.model_name) from None
            finally:
                self._finished(tracker.record(tokens))

    async def answer(
        self, http: web.Request, request: GenerationRequest, stream: bool, answer: AnswerFormat
    ) -> web.StreamResponse:
        """A busy node refuses before tokenizing anything (refusals stay cheap under
        overload), and one whose client left while it waited for a slot is dropped there;
        then a prompt too long for the context fails, before a stream starts."""
        async with self.guard.slot(lambda: _gone(http)):
            tracker = Tracker(answer.id, answer.endpoint, stream)
            try:
                generation = await self.backend.start(request)
            except SwarmError as e:
                raise from_swarm_error(e, self.backend.model_name) from None
            try:
                if stream:
                    return await _stream(http, generation, answer, tracker)
                return await _whole(http, generation, answer, tracker)
            except SwarmError as e:  # before the answer started (no route, no layers)
                raise from_swarm_error(e, self.backend.model_name) from None
            except asyncio.CancelledError:  # a server run with handler_cancellation
                tracker.outcome = "disconnected"
                raise
            finally:
                self._finished(tracker.record(generation.prompt_tokens))


async def _whole(
    http: web.Request, generation: Generation, answer: AnswerFormat, tracker: Tracker
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
    except SwarmError:
        tracker.outcome = "error"
        raise
    if tracker.done is None:
        raise internal("generation ended without finishing")
    return web.json_response(answer.whole("".join(text), logprobs, tracker.done, tracker.timing()))


async def _stream(
    http: web.Request, generation: Generation, answer: AnswerFormat, tracker: Tracker
) -> web.StreamResponse:
    """A client that goes away ends the loop at its next event; closing the generator then
    closes the session on every hop."""
    out = web.StreamResponse(
        headers={"Content-Type": answer.content_type, "Cache-Control": "no-cache"}
    )
    async with aclosing(generation.events()) as events:
        try:
            event = await anext(events, None)
        except SwarmError:  # nothing sent yet: a plain error response
            tracker.outcome = "error"
            raise
        try:
            await out.prepare(http)
            await _write(out, answer.opening(generation.prompt_tokens))
            await _relay(http, out, event, events, answer, tracker)
            await _write(out, answer.closing())
            await out.write_eof()
        except ConnectionResetError:
            tracker.outcome = "disconnected"
    return out


async def _relay(
    http: web.Request,
    out: web.StreamResponse,
    event: TextDelta | Done | None,
    events: AsyncIterator[TextDelta | Done],
    answer: AnswerFormat,
    tracker: Tracker,
) -> None:
    try:
        while event is not None:
            if _gone(http):
                raise ConnectionResetError("the client went away")
            tracker.saw(event)
            if isinstance(event, TextDelta):
                await _write(out, answer.part(event))
            else:
                await _write(out, answer.ending(event, tracker.timing()))
            event = await anext(events, None)
    except SwarmError as e:  # the stream has started: the error is its last event
        tracker.outcome = "error"
        await _write(out, answer.failure(from_swarm_error(e)))
    except ConnectionResetError:
        raise
    except Exception:
        log.exception("generation failed mid-stream")
        tracker.outcome = "error"
        await _write(out, answer.failure(internal("generation failed; see the node's log")))


def _gone(http: web.Request) -> bool:
    transport = http.transport
    return transport is None or transport.is_closing()


async def _write(out: web.StreamResponse, data: bytes) -> None:
    if data:
        await out.write(data)
