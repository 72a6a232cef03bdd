"""What a request for a route this node does not have gets: OpenAI's error JSON (404, or 405
for a known path asked with another method) naming what was asked, and for the routes other
servers have and swarm does not serve yet, saying so by name, never aiohttp's plain-text
"404: Not Found" that OpenAI's clients cannot read. Under /v1/messages the error is
Anthropic's JSON; Ollama's /api/ routes answer in Ollama's shape on their own (ollama.py)."""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web

from swarm.api.errors import ApiError, anthropic_body, body, response
from swarm.api.guard import Handler

# routes clients ask for that this node does not serve yet, and what they are
NOT_SERVED_YET = {
    "/v1/messages/count_tokens": "Anthropic's token counting is not served yet",
    "/v1/messages/batches": "Anthropic's message batches are not served",
    "/v1/responses": "OpenAI's Responses API is not served yet",
    "/v1/audio/transcriptions": "audio is not served",
    "/v1/images/generations": "images are not served",
}


def unknown_route(method: str, path: str, allowed: Iterable[str] = ()) -> ApiError:
    """The error for `method path`, which no route of this node takes; `allowed`: the
    methods the path does take, where it is known."""
    allowed = sorted(set(allowed) - {"HEAD"})
    if allowed:
        return ApiError(
            405,
            f"{method} {path} is not allowed; it takes {', '.join(allowed)}",
            code="method_not_allowed",
        )
    why = NOT_SERVED_YET.get(path.rstrip("/"))
    said = f"{why} by swarm" if why else "this node has no such route"
    return ApiError(
        404,
        f"{method} {path}: {said}; it serves /v1/chat/completions, /v1/completions, "
        "/v1/embeddings, /v1/models, Anthropic's /v1/messages (and Ollama's API under /api/)",
        kind="not_found_error",
        code="not_found",
    )


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own 404 and 405 (no route matched) as OpenAI's error JSON, or Anthropic's
    under its /v1/messages."""
    anthropic = f"{request.path}/".startswith("/v1/messages/")
    shape = anthropic_body if anthropic else body
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as e:
        if request.match_info.http_exception is None:
            raise
        return response(unknown_route(request.method, request.path, e.allowed_methods), shape)
    except web.HTTPNotFound:
        if request.match_info.http_exception is None:
            raise
        return response(unknown_route(request.method, request.path), shape)
