"""Errors as the API's error JSON: OpenAI's shape on its routes, Ollama's on the Ollama routes,
Anthropic's on /v1/messages. The one place exceptions become HTTP responses."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from aiohttp import web

from swarm.errors import NoChatTemplateError, SamplingError, SwarmError

# Retry-After for failures of the swarm itself (no route, a hop down, caches full): long
# enough for gossip and re-placement to settle.
SWARM_RETRY_AFTER_S = 5


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        self.code = code
        self.retry_after_s = retry_after_s


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


def model_not_found(asked: str, served: Sequence[str], missing: str = "does not exist") -> ApiError:
    """`served`: the names of the models the swarm serves, as the route lists them;
    `missing`: how the route's API says a model is unknown."""
    names = ", ".join(repr(name) for name in served) or "no model yet"
    return ApiError(
        404,
        f"model {asked!r} {missing}; this swarm serves {names}",
        "model",
        "not_found_error",
        "model_not_found",
    )


def model_unavailable(name: str, why: str) -> ApiError:
    """A model the swarm knows that it cannot serve now: its layers, or its nodes, missing."""
    return ApiError(
        503,
        f"model {name!r} cannot be served now: {why}",
        "model",
        "service_unavailable",
        "swarm_unavailable",
        SWARM_RETRY_AFTER_S,
    )


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, kind="authentication_error", code="invalid_api_key")


def too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than this node's limit of {limit} bytes (api.max_body_bytes)",
        code="request_too_large",
    )


QUEUE_FULL = "its queue is full (api.queue_size)"


def too_many(limit: int, retry_after_s: int, why: str = QUEUE_FULL) -> ApiError:
    """`why`: why the request may not wait for a slot (the guard says)."""
    return ApiError(
        429,
        f"this node already runs {limit} requests (api.max_concurrent_requests) and {why}; "
        f"retry in {retry_after_s} s or ask another node",
        kind="rate_limit_error",
        code="rate_limit_exceeded",
        retry_after_s=retry_after_s,
    )


def from_swarm_error(error: SwarmError, model: str = "") -> ApiError:
    """Bad input is a 400; anything else the swarm raises while serving (no route, a failed
    hop, full caches, a busy compute queue) is the swarm's trouble: 503 with Retry-After,
    naming `model` where the request was for one (its missing layers, for instance)."""
    if isinstance(error, SamplingError):
        return bad_request(str(error), error.param)
    if isinstance(error, NoChatTemplateError):  # a retry cannot help: never a 503
        return ApiError(400, str(error), "messages", code=NoChatTemplateError.code)
    what = f"model {model!r}" if model else "this request"
    return ApiError(
        503,
        f"the swarm cannot serve {what} now: {error}",
        kind="service_unavailable",
        code="swarm_unavailable",
        retry_after_s=SWARM_RETRY_AFTER_S,
    )


def internal(message: str) -> ApiError:
    return ApiError(500, message, kind="server_error")


def body(error: ApiError) -> dict[str, object]:
    """OpenAI's error JSON."""
    return {
        "error": {
            "message": error.message,
            "type": error.kind,
            "param": error.param,
            "code": error.code,
        }
    }


def ollama_body(error: ApiError) -> dict[str, object]:
    """Ollama's error JSON: its clients read only the message."""
    return {"error": error.message}


# Anthropic's error type for a status; any other is invalid_request_error below 500,
# api_error from there. The swarm's 503 (no route, a hop down, full caches, a node leaving)
# keeps its status, which Anthropic's clients retry, with the type of Anthropic's own 529.
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_body(error: ApiError) -> dict[str, object]:
    """Anthropic's error JSON."""
    fallback = "invalid_request_error" if error.status < 500 else "api_error"
    kind = _ANTHROPIC_TYPES.get(error.status, fallback)
    return {"type": "error", "error": {"type": kind, "message": error.message}}


ErrorShape = Callable[[ApiError], dict[str, object]]  # body, ollama_body or anthropic_body


def response(error: ApiError, shape: ErrorShape = body) -> web.Response:
    headers = {}
    if error.retry_after_s:
        headers["Retry-After"] = str(error.retry_after_s)
    if error.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="swarm"'
    return web.Response(
        status=error.status,
        text=json.dumps(shape(error)),
        content_type="application/json",
        headers=headers or None,
    )
