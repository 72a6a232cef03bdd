"""The client's streams over a real socket: an answer whose connection closes before its
[DONE] is an error that says so, never a stream that just ends short; a refusal carries its
status and Retry-After."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from swarm.client import SwarmClient
from swarm.errors import LinkError, RefusedError

CHUNK = b'data: {"choices": [{"index": 0, "text": "w5"}]}\n\n'

Ending = Callable[[web.Request, web.StreamResponse], Awaitable[None]]


async def _done(request: web.Request, out: web.StreamResponse) -> None:
    await out.write(b"data: [DONE]\n\n")
    await out.write_eof()


async def _closed_cleanly(request: web.Request, out: web.StreamResponse) -> None:
    await out.write_eof()  # the end of the body, with no [DONE] before it


async def _killed(request: web.Request, out: web.StreamResponse) -> None:
    assert request.transport is not None
    request.transport.abort()  # as a node killed -9: the body's chunks stop mid-way


async def _node(ending: Ending) -> AsyncIterator[str]:
    async def answer(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(CHUNK)
        await ending(request, out)
        return out

    async for address in _serving(answer):
        yield address


async def _serving(
    answer: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _read(ending: Ending) -> list[dict[str, object]]:
    async for address in _node(ending):
        return [chunk async for chunk in SwarmClient(address, timeout_s=10).complete({})]
    raise AssertionError("the node did not start")


async def test_a_stream_ends_at_its_done() -> None:
    assert len(await _read(_done)) == 1


@pytest.mark.parametrize(
    ("ending", "says"),
    [
        (_closed_cleanly, "closed before the end of the stream"),
        (_killed, "closed mid-stream"),
    ],
    ids=["closed", "killed"],
)
async def test_a_stream_whose_connection_closes_before_its_done_is_an_error(
    ending: Ending, says: str
) -> None:
    with pytest.raises(LinkError, match=f"the answer broke off: the connection to .* {says}"):
        await _read(ending)


@pytest.mark.parametrize(
    ("status", "retry_after", "seconds"),
    [
        (429, "7", 7.0),
        (503, "5", 5.0),
        (429, None, None),
        (429, "Wed, 21 Oct 2026 07:28:00 GMT", None),  # a date: swarm's nodes send seconds
        (429, "-3", None),
        (429, "inf", None),
        (400, None, None),
    ],
)
async def test_a_refusal_carries_its_status_and_retry_after(
    status: int, retry_after: str | None, seconds: float | None
) -> None:
    async def refuse(request: web.Request) -> web.StreamResponse:
        headers = {} if retry_after is None else {"Retry-After": retry_after}
        error = {"error": {"message": "busy", "code": "rate_limit_exceeded"}}
        return web.json_response(error, status=status, headers=headers)

    async for address in _serving(refuse):
        with pytest.raises(RefusedError, match=f"refused the request \\({status}\\): busy") as e:
            async for _ in SwarmClient(address, timeout_s=10).complete({}):
                pass
        assert (e.value.status, e.value.retry_after_s) == (status, seconds)
