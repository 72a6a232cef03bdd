"""A request's `model` picks the model, on every route that takes one: the one place a name
is matched against the swarm's models. A request for this node's model goes to the route's
handler, or, while this node is busy and another copy of the model would give its tokens
sooner, to that copy (`model_routing.spread`); one for a model other members serve goes, as
it came (body, token, streaming), to the least loaded of them; an unknown name is a 404
listing the models served, in the route's error shape. Whether a model's layers are served
is the pipeline's to say where it runs (it waits while they move between nodes, else a 503
naming the model and the layers)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from swarm.api.answers import Answers
from swarm.api.errors import ApiError, model_not_found, model_unavailable
from swarm.api.guard import Handler
from swarm.model_routing import named, ollama_name, spread
from swarm.schema import ServedModel, to_json

log = logging.getLogger(__name__)

# set on a request one node sends another: the receiver answers it itself or refuses it,
# and never sends it on (a view that changed between them cannot make a loop)
FORWARDED = "X-Swarm-Forwarded"
# what a forwarded request carries of the client's: its token and what says how to read it
_SENT = ("Authorization", "x-api-key", "Content-Type", "Accept", "anthropic-version")
# what an answer brings back of the member's headers (aiohttp sets the framing again)
_RETURNED = ("Content-Type", "Retry-After", "WWW-Authenticate", "Cache-Control")
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Naming:
    """How an API names models in its 404: each name as it lists them, and its words."""

    listed: Callable[[str], str]
    missing: str


OPENAI = Naming(str, "does not exist")  # Anthropic's routes say it as OpenAI's do
OLLAMA = Naming(ollama_name, "not found")


def unknown_model(asked: str, models: Sequence[ServedModel], naming: Naming = OPENAI) -> ApiError:
    return model_not_found(asked, [naming.listed(m.name) for m in models], naming.missing)


class ModelRoutes:
    """`models`: the swarm's models as this node sees them now, its own first."""

    def __init__(
        self,
        answers: Answers,
        models: Callable[[], Sequence[ServedModel]],
        connect_timeout_s: float,
    ) -> None:
        self._answers = answers
        self._models = models
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)
        self._http: aiohttp.ClientSession | None = None  # opened by the first request sent on
        self._running = 0  # requests for this node's model its handlers answer now
        self._sent: dict[str, int] = {}  # requests sent to each copy of this node's model, running

    def routed(
        self,
        handler: Handler,
        fields: tuple[str, ...] = ("model",),
        naming: Naming = OPENAI,
    ) -> Handler:
        """`handler` for the requests whose model this node serves. `fields`: where the body
        names the model, the first present wins; `naming`: how its 404 names the models."""

        async def route(request: web.Request) -> web.StreamResponse:
            body = await self._answers.body(request)
            asked = next((body[f] for f in fields if f in body), None)
            if asked is not None and (not isinstance(asked, str) or not asked):
                return await handler(request)  # its own 400 for a bad name
            models = self._models()
            # no name asks for this node's model (listed first), as its handlers take it
            model = models[0] if asked is None else named(models, asked)
            if model is None:
                raise unknown_model(str(asked), models, naming)
            forwarded = FORWARDED in request.headers
            if model.here:
                if forwarded:
                    return await self._here(request, handler)
                return await self._spread(request, model, handler)
            if forwarded:
                raise model_unavailable(model.name, "the node it was sent to does not serve it")
            answer = await self._forward(request, model.name, model.entries)
            if answer is None:
                raise model_unavailable(model.name, "no node serving it can be reached from here")
            return answer

        return route

    def listed(self) -> Sequence[ServedModel]:
        return self._models()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def _spread(
        self, request: web.Request, model: ServedModel, handler: Handler
    ) -> web.StreamResponse:
        """The request here, or on the copy `spread` picks; here when that copy cannot be
        reached. Counted from the moment it is routed (a generation takes its slot later)."""
        copy = spread(model, self._running, self._sent)
        if copy is None:
            return await self._here(request, handler)
        self._sent[copy] = self._sent.get(copy, 0) + 1
        try:
            # a copy that is full (429) or leaving (503) is not this request's failure: the
            # request runs here, as it would have without a copy
            answer = await self._forward(request, model.name, (copy,), _BUSY)
        finally:
            self._sent[copy] -= 1
        return await self._here(request, handler) if answer is None else answer

    async def _here(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self._running += 1
        try:
            return await handler(request)
        finally:
            self._running -= 1

    async def _forward(
        self,
        request: web.Request,
        name: str,
        entries: Sequence[str],
        passed_over: frozenset[int] = frozenset(),
    ) -> web.StreamResponse | None:
        """The request as it came, to the first of `entries` that takes it, and its answer
        back as it streams; the next entry when one cannot be reached or answers a status in
        `passed_over`; None when none takes it."""
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=self._timeout, auto_decompress=False)
        headers = {h: request.headers[h] for h in _SENT if h in request.headers}
        headers[FORWARDED] = "1"
        data = self._answers.raw_body(request)
        for entry in entries:
            url = f"http://{entry}{request.rel_url}"
            try:
                answer = await self._http.post(url, data=data, headers=headers)
            except (aiohttp.ClientConnectionError, TimeoutError) as e:
                log.warning("could not send a request for %s to %s: %s", name, entry, e)
                continue
            async with answer:
                if answer.status in passed_over:
                    log.info("%s answered %d for %s; passing it over", entry, answer.status, name)
                    continue
                return await _relay(request, answer)
        return None


_BUSY = frozenset({429, 503})  # a copy that takes no more requests now


async def _relay(request: web.Request, answer: aiohttp.ClientResponse) -> web.StreamResponse:
    """The member's answer, chunk by chunk as it comes. A member that breaks off mid-answer
    cuts the client's connection too, so the client never takes a part for the whole."""
    headers = {h: answer.headers[h] for h in _RETURNED if h in answer.headers}
    out = web.StreamResponse(status=answer.status, headers=headers)
    await out.prepare(request)
    try:
        async for chunk in answer.content.iter_chunked(_CHUNK):
            await out.write(chunk)
        await out.write_eof()
    except ConnectionResetError:  # the client went away: closing `answer` tells the member
        pass
    except aiohttp.ClientError as e:
        log.warning("the answer from %s broke off: %s", answer.url.host, e)
        if request.transport is not None:
            request.transport.close()
    return out


def model_entry(model: ServedModel, context_tokens: int | None) -> dict[str, Any]:
    """A model as OpenAI's /v1/models lists it, with which of its layers are served now;
    its context where this node knows it (its own model)."""
    entry: dict[str, Any] = {"id": model.name, "object": "model", "created": 0, "owned_by": "swarm"}
    if context_tokens is not None:
        entry["context_length"] = context_tokens
        entry["max_model_len"] = context_tokens  # vLLM's name for the same
    entry["aliases"] = list(model.aliases)
    entry["model_id"] = model.model_id
    entry["coverage"] = to_json(model.coverage)
    return entry
