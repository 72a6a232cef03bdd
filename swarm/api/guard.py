"""What stands before every API route: the API token, the body size limit and the
per-node limit on generations in flight. Peers' links and gossip are not API routes: the swarm
secret authenticates them, so they never pass through here."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

from swarm.api.errors import (
    ApiError,
    ErrorShape,
    body,
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
_SMOOTHING = 0.2  # weight of the latest request in the moving average of service time
LEAVING = "this node is shutting down; send the request to another node"
CLIENT_GONE = "the client closed its connection while it waited for a slot"


def _never_gone() -> bool:
    """A client that never goes away while it waits: one whose connection is not watched."""
    return False


@dataclass(frozen=True)
class ApiPolicy:
    token: str | None  # `Authorization: Bearer <token>` or `x-api-key: <token>`; None: no check
    max_body_bytes: int  # a longer request body is refused with 413
    max_concurrent_requests: int  # generations in flight at this entry; more get 429
    retry_after_s: int  # what a refused client is told to wait before any is measured
    queue_size: int = 0  # requests that may wait for a slot; more get 429 at once
    queue_timeout_s: float = 30.0  # how long one waits before its 429
    body_timeout_s: float = 30.0  # seconds a request body may take to arrive; then 408
    # seconds to connect to the member a request for another model goes to; then the next
    forward_connect_timeout_s: float = 5.0

    @classmethod
    def from_config(cls, api: ApiConfig) -> ApiPolicy:
        """Reads the token file: a missing one fails here, before the node loads anything."""
        return cls(
            token=api.resolve_token(),
            max_body_bytes=api.max_body_bytes,
            max_concurrent_requests=api.max_concurrent_requests,
            retry_after_s=api.retry_after_s,
            queue_size=api.queue_size,
            queue_timeout_s=api.queue_timeout_s,
            forward_connect_timeout_s=api.forward_connect_timeout_s,
        )


class Guard:
    def __init__(
        self,
        policy: ApiPolicy,
        count: Callable[[str, int], None],
        clock: Callable[[], float] = time.monotonic,  # seconds: how long a slot is held
    ) -> None:
        self.policy = policy
        self._clock = clock
        self.in_flight = 0
        self.accepting = True  # False once the node is leaving: new generations are refused
        self._count = count  # (route, HTTP status) of every answered request
        # FIFO, each with whether its client is gone; a slot is handed over
        self._waiting: deque[tuple[asyncio.Future[None], Callable[[], bool]]] = deque()
        self._service_s: float | None = None  # moving average of how long a slot is held

    @property
    def queued(self) -> int:
        """Requests waiting for a slot whose clients are still there."""
        return sum(not w.done() and not gone() for w, gone in self._waiting)

    def expected_wait_s(self) -> float | None:
        """Seconds until a slot is likely free for one more client: the measured service
        time, shared by the slots, for everyone already waiting and this client; None until
        a request has finished."""
        if self._service_s is None:
            return None
        return self._service_s * (self.queued + 1) / self.policy.max_concurrent_requests

    def retry_after_s(self) -> int:
        """`expected_wait_s` in whole seconds; the configured value until it is measured."""
        expected = self.expected_wait_s()
        return self.policy.retry_after_s if expected is None else max(1, math.ceil(expected))

    def protect(self, route: str, handler: Handler, shape: ErrorShape = body) -> Handler:
        """The handler behind the token check, with ApiError turned into error JSON of the
        route's `shape` (OpenAI's unless told) and anything unexpected into a 500 of the same
        shape (logged with its traceback)."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            try:
                self._check_token(request)
                answer = await handler(request)
            except ApiError as e:
                answer = response(e, shape)
            except Exception:
                log.exception("%s %s failed", request.method, request.path)
                answer = response(internal("the node failed to answer; see its log"), shape)
            self._count(route, answer.status)
            return answer

        return guarded

    def _check_token(self, request: web.Request) -> None:
        """The token as OpenAI's and Ollama's clients send it, `Authorization: Bearer`, or as
        Anthropic's do, `x-api-key`, on every route: either header that holds it will do."""
        expected = self.policy.token
        if expected is None:
            return
        offered = _offered_tokens(request)
        if not offered:
            raise unauthorized(
                "this node needs an API token: send 'Authorization: Bearer <token>' "
                "(or 'x-api-key: <token>')"
            )
        if not any(hmac.compare_digest(given, expected.encode()) for given in offered):
            raise unauthorized("the API token is wrong")

    async def read_body(self, request: web.Request) -> bytes:
        """The whole body, or 413 as soon as it passes the limit (without reading the rest),
        or 408 when it trickles in slower than `policy.body_timeout_s`."""
        limit = self.policy.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise too_large(limit)
        parts: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.policy.body_timeout_s):
                while chunk := await request.content.read(_READ_CHUNK):
                    size += len(chunk)
                    if size > limit:
                        raise too_large(limit)
                    parts.append(chunk)
        except TimeoutError:
            raise ApiError(
                408, f"the request body did not arrive within {self.policy.body_timeout_s:g} s"
            ) from None
        return b"".join(parts)

    @asynccontextmanager
    async def slot(self, gone: Callable[[], bool] = _never_gone) -> AsyncIterator[None]:
        """Hold one of this node's generation slots, waiting in a bounded queue when all are
        taken; 429 with Retry-After when the queue is full, when the slots free too slowly
        for a new waiter to get one within `queue_timeout_s`, or when the wait runs out; 503
        once the node is leaving (`accepting` is off). `gone`: whether the client has closed its
        connection (the server does not cancel its handler): a waiter whose client is gone
        takes no room in the queue, and the slot it is handed passes on untouched (499)."""
        if not self.accepting:
            raise from_swarm_error(NodeLeavingError(LEAVING))
        await self._acquire(gone)
        if gone():
            self._release()
            raise ApiError(499, CLIENT_GONE, code="client_closed_request")
        started = self._clock()
        try:
            yield
        finally:
            held = self._clock() - started
            self._service_s = (
                held if self._service_s is None else 0.8 * self._service_s + 0.2 * held
            )
            self._release()

    async def _acquire(self, gone: Callable[[], bool]) -> None:
        limit = self.policy.max_concurrent_requests
        if self.in_flight < limit and not self.queued:
            self.in_flight += 1
            return
        if self.queued >= self.policy.queue_size:
            raise too_many(limit, self.retry_after_s())
        expected, timeout = self.expected_wait_s(), self.policy.queue_timeout_s
        if expected is not None and expected > timeout:  # it would wait only to be refused
            why = (
                f"at the pace requests finish now a slot would come in about {expected:.0f} s, "
                f"later than a request waits (api.queue_timeout_s = {timeout:g} s)"
            )
            raise too_many(limit, self.retry_after_s(), why)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((waiter, gone))
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(waiter)
        except TimeoutError:
            if not waiter.done():  # no slot came: the waiter leaves the queue
                waiter.cancel()
                waited = f"none came free in {timeout:g} s of waiting (api.queue_timeout_s)"
                raise too_many(limit, self.retry_after_s(), waited) from None
        except BaseException:  # the client went away while waiting
            if waiter.done():
                self._release()  # the slot handed over passes on
            waiter.cancel()
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiting.remove((waiter, gone))

    def _release(self) -> None:
        """Hand the slot to the first waiter, or free it."""
        while self._waiting:
            waiter, _ = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.in_flight -= 1


def _offered_tokens(request: web.Request) -> list[bytes]:
    """The tokens the request's headers offer, as bytes: aiohttp hands undecodable header
    bytes over as lone surrogates."""
    scheme, _, bearer = request.headers.get("Authorization", "").partition(" ")
    candidates = [
        bearer if scheme.lower() == "bearer" else "",
        request.headers.get("x-api-key", ""),
    ]
    return [c.strip().encode("utf-8", "surrogateescape") for c in candidates if c.strip()]
