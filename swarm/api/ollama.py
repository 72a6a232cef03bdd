"""Ollama's API: POST /api/chat and /api/generate (NDJSON streamed by default, or one JSON
body with "stream": false), GET /api/tags, /api/ps and /api/version, POST /api/show, and
POST /api/embed and /api/embeddings (`swarm.api.embeddings`). The body
becomes the same GenerationRequest the OpenAI routes make (`swarm.api.ollama_fields`) and runs
through the same path (`swarm.api.answers`); only the answer's shape is Ollama's."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from swarm.api import ollama_models
from swarm.api.activity import Timing
from swarm.api.answers import Answers
from swarm.api.backend import Done, TextDelta, TokenLogprob
from swarm.api.embeddings import EmbeddingHandlers
from swarm.api.errors import ApiError, bad_request
from swarm.api.guard import Handler
from swarm.api.ollama_fields import OllamaRequest, check_model, parse_chat, parse_generate
from swarm.api.tools import CallWatch, ToolCall, Tools
from swarm.schema import ServedModel

_NS = 1_000_000_000


class OllamaHandlers:
    def __init__(self, answers: Answers, models: Callable[[], Sequence[ServedModel]]) -> None:
        """`models`: the swarm's models as this node sees them now, its own first."""
        self.answers = answers
        self._models = models
        self.embeddings = EmbeddingHandlers(answers)

    async def chat(self, http: web.Request) -> web.StreamResponse:
        return await self._generate(http, chat=True)

    async def generate(self, http: web.Request) -> web.StreamResponse:
        return await self._generate(http, chat=False)

    async def _generate(self, http: web.Request, chat: bool) -> web.StreamResponse:
        backend = self.answers.backend
        body = await self.answers.body(http)
        parse = parse_chat if chat else parse_generate
        parsed = parse(body, backend.model_name, backend.context_tokens)
        answer = OllamaAnswer(parsed, chat)
        if parsed.request is None:
            return web.json_response(answer.nothing(parsed))
        return await self.answers.answer(http, parsed.request, parsed.stream, answer)

    async def tags(self, http: web.Request) -> web.Response:
        others = [m for m in self._models() if not m.here]
        return web.json_response(ollama_models.tags(self.answers.backend.details, others))

    async def running(self, http: web.Request) -> web.Response:
        return web.json_response(ollama_models.running(self.answers.backend.details))

    async def version(self, http: web.Request) -> web.Response:
        return web.json_response(ollama_models.version())

    def routes(self) -> list[tuple[str, str, str, Handler]]:
        """(method, path, the name /metrics counts it by, handler) of each route served."""
        return [
            ("POST", "/api/chat", "ollama_chat", self.chat),
            ("POST", "/api/generate", "ollama_generate", self.generate),
            ("GET", "/api/tags", "ollama_tags", self.tags),
            ("POST", "/api/show", "ollama_show", self.show),
            ("GET", "/api/ps", "ollama_ps", self.running),
            ("GET", "/api/version", "ollama_version", self.version),
            ("POST", "/api/embed", "ollama_embed", self.embeddings.ollama),
            ("POST", "/api/embeddings", "ollama_embeddings", self.embeddings.ollama_old),
        ]

    async def elsewhere(self, http: web.Request) -> web.Response:
        """The rest of Ollama's API (pull, create, ...) and a route asked with another
        method: an error that says so in Ollama's shape, rather than aiohttp's page."""
        served = {path: method for method, path, _, _ in self.routes()}
        if http.path in served:
            raise ApiError(405, f"{http.path} takes {served[http.path]}, not {http.method}")
        listed = ", ".join(f"{method} {path}" for method, path, _, _ in self.routes())
        raise ApiError(
            404, f"{http.method} {http.path} is not served here; this node answers {listed}"
        )

    async def show(self, http: web.Request) -> web.Response:
        """Older clients name the model as `name`; `verbose` would add the tokenizer's
        vocabulary, which this answer leaves out either way."""
        body = await self.answers.body(http)
        unknown = set(body) - {"model", "name", "verbose"}
        if unknown:
            name = sorted(unknown)[0]
            raise bad_request(f"unknown field {name!r}", name)
        check_model(body, "name" if "name" in body else "model")
        return web.json_response(ollama_models.show(self.answers.backend.details))


class OllamaAnswer:
    """One request's answer in Ollama's shapes (an `AnswerFormat`): a JSON line per text
    delta, then one with done true and the counts and durations."""

    content_type = "application/x-ndjson"

    def __init__(self, parsed: OllamaRequest, chat: bool) -> None:
        self.id = "ollama-" + uuid.uuid4().hex[:24]
        self.endpoint = "ollama_chat" if chat else "ollama_generate"
        self.model = parsed.model  # Ollama's answers name the model as the request did
        self.chat = chat
        sampling = parsed.request.sampling if parsed.request is not None else None
        self.logprobs = sampling is not None and sampling.logprobs is not None
        self._watch = CallWatch(parsed.tools) if parsed.tools else None  # a stream's call
        self._tools: Tools | None = parsed.tools

    def opening(self, prompt_tokens: int) -> bytes:
        return b""

    def part(self, delta: TextDelta) -> bytes:
        return self._text_line(delta if self._watch is None else self._watch.push(delta))

    def ending(self, done: Done, timing: Timing) -> bytes:
        held, calls = self._watch.finish() if self._watch else (None, ())
        out = self._text_line(held)
        if calls:
            out += _line({**self._base(False), "message": _message("", calls)})
        return out + _line(self._last("", (), done, timing))

    def failure(self, error: ApiError) -> bytes:
        return _line({"error": error.message})

    def closing(self) -> bytes:
        return b""

    def whole(
        self, text: str, logprobs: Sequence[TokenLogprob], done: Done, timing: Timing
    ) -> dict[str, Any]:
        calls = self._tools.calls_in(text) if self._tools else ()
        last = self._last("" if calls else text, logprobs, done, timing)
        if calls:
            last["message"] = _message("", calls)
        return last

    def nothing(self, parsed: OllamaRequest) -> dict[str, Any]:
        """The answer to a request with nothing to generate."""
        return {
            **self._base(True),
            **self._text("", ()),
            "done_reason": "unload" if parsed.unload else "load",
        }

    def _base(self, done: bool) -> dict[str, Any]:
        return {
            "model": self.model,
            "created_at": ollama_models.timestamp(time.time()),
            "done": done,
        }

    def _text(self, text: str, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        piece: dict[str, Any] = {"message": _message(text)} if self.chat else {"response": text}
        if self.logprobs and logprobs:
            piece["logprobs"] = [lp.to_json() for lp in logprobs]
        return piece

    def _text_line(self, delta: TextDelta | None) -> bytes:
        if delta is None or not (delta.text or delta.logprobs):
            return b""
        return _line({**self._base(False), **self._text(delta.text, delta.logprobs)})

    def _last(
        self, text: str, logprobs: Sequence[TokenLogprob], done: Done, timing: Timing
    ) -> dict[str, Any]:
        """Ollama's counts, and its durations in nanoseconds: the prompt's until the first
        token (tokenizing, the prefill through every hop, the first sample), the answer's
        from there on. The model is always loaded: load_duration is 0."""
        first = timing.elapsed_s if timing.first_token_s is None else timing.first_token_s
        return {
            **self._base(True),
            **self._text(text, logprobs),
            "done_reason": done.finish_reason,
            "total_duration": int(timing.elapsed_s * _NS),
            "load_duration": 0,
            "prompt_eval_count": done.prompt_tokens,
            "prompt_eval_duration": int(first * _NS),
            "eval_count": done.completion_tokens,
            "eval_duration": int((timing.elapsed_s - first) * _NS),
        }


def _message(text: str, calls: Sequence[ToolCall] = ()) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"function": {"name": c.name, "arguments": json.loads(c.arguments)}} for c in calls
        ]
    return message


def _line(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode() + b"\n"
