"""Errors as OpenAI's error JSON. The one place exceptions become HTTP responses."""

from __future__ import annotations

import json

from aiohttp import web

from swarm.errors import (
    HopFailedError,
    KVCacheFullError,
    LinkError,
    NodeLeavingError,
    SamplingError,
    SwarmError,
)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        self.retry_after_s: int | None = None


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


def from_swarm_error(error: SwarmError) -> ApiError:
    if isinstance(error, SamplingError):
        return ApiError(400, str(error))
    if isinstance(error, (KVCacheFullError, HopFailedError, LinkError, NodeLeavingError)):
        api = ApiError(
            503, f"the swarm cannot serve this request now: {error}", kind="service_unavailable"
        )
        api.retry_after_s = 5
        return api
    unavailable = getattr(error, "missing", None)
    if unavailable is not None:
        api = ApiError(503, str(error), kind="service_unavailable")
        api.retry_after_s = 5
        return api
    return ApiError(400, str(error))


def response(error: ApiError) -> web.Response:
    body = {
        "error": {"message": error.message, "type": error.kind, "param": error.param, "code": None}
    }
    headers = {"Retry-After": str(error.retry_after_s)} if error.retry_after_s else None
    return web.Response(
        status=error.status, text=json.dumps(body), content_type="application/json", headers=headers
    )
