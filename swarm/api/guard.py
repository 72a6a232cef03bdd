"""What stands before every API route: the Bearer token, the body size limit and the
per-node limit on generations in flight. Peers' links and gossip are not API routes: the swarm
secret authenticates them, so they never pass through here."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from aiohttp import web

from swarm.api.errors import (
    ApiError,
    from_swarm_error,
    internal,
    response,
    too_large,
    too_many,
    unauthorized,
)
from swarm.config import ApiConfig
from swarm.errors import NodeLeavingError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_READ_CHUNK = 64 * 1024
LEAVING = "this node is shutting down; send the request to another node"


@dataclass(frozen=True)
class ApiPolicy:
    token: str | None  # clients must send `Authorization: Bearer <token>`; None = no check
    max_body_bytes: int  # a longer request body is refused with 413
    max_concurrent_requests: int  # generations in flight at this entry; more get 429
    retry_after_s: int  # what a refused client is told to wait

    @classmethod
    def from_config(cls, api: ApiConfig) -> ApiPolicy:
        """Reads the token file: a missing one fails here, before the node loads anything."""
        return cls(
            token=api.resolve_token(),
            max_body_bytes=api.max_body_bytes,
            max_concurrent_requests=api.max_concurrent_requests,
            retry_after_s=api.retry_after_s,
        )


class Guard:
    def __init__(self, policy: ApiPolicy, count: Callable[[str, int], None]) -> None:
        self.policy = policy
        self.in_flight = 0
        self.accepting = True  # False once the node is leaving: new generations are refused
        self._count = count  # (route, HTTP status) of every answered request

    def protect(self, route: str, handler: Handler) -> Handler:
        """The handler behind the token check, with ApiError turned into OpenAI error JSON
        and anything unexpected into a 500 of the same shape (logged with its traceback)."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            try:
                self._check_token(request)
                answer = await handler(request)
            except ApiError as e:
                answer = response(e)
            except Exception:
                log.exception("%s %s failed", request.method, request.path)
                answer = response(internal("the node failed to answer; see its log"))
            self._count(route, answer.status)
            return answer

        return guarded

    def _check_token(self, request: web.Request) -> None:
        expected = self.policy.token
        if expected is None:
            return
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise unauthorized("this node needs an API token: send 'Authorization: Bearer <token>'")
        if not hmac.compare_digest(given.strip().encode(), expected.encode()):
            raise unauthorized("the API token is wrong")

    async def read_body(self, request: web.Request) -> bytes:
        """The whole body, or 413 as soon as it passes the limit (without reading the rest)."""
        limit = self.policy.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise too_large(limit)
        parts: list[bytes] = []
        size = 0
        while chunk := await request.content.read(_READ_CHUNK):
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            parts.append(chunk)
        return b"".join(parts)

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one of this node's generation slots, or raise 429 with Retry-After; 503 once
        the node is leaving (`accepting` is off)."""
        if not self.accepting:
            raise from_swarm_error(NodeLeavingError(LEAVING))
        limit = self.policy.max_concurrent_requests
        if self.in_flight >= limit:
            raise too_many(limit, self.policy.retry_after_s)
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
