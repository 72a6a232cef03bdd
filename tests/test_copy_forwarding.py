"""A request an entry sends on to another copy of its model: the copy's answer comes back as
it came, unless the copy takes no more requests now (429: full; 503: leaving), when the
request runs at the entry as it would have without that copy. The copy here is a plain HTTP
server that answers as a full node does; the entry's routing is the real one."""

from __future__ import annotations

import asyncio
from typing import cast

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from harness.polling import until
from swarm.api.answers import Answers
from swarm.api.backend import Backend
from swarm.api.guard import ApiPolicy, Guard
from swarm.api.model_routes import ModelRoutes
from swarm.schema import Copy, Coverage, ServedModel

ROUTE = "/v1/chat/completions"


async def _serve(app: web.Application) -> TestServer:
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


@pytest.mark.parametrize(
    ("copy_status", "answered_by"),
    [(200, "copy"), (429, "entry"), (503, "entry"), (400, "copy")],
)
async def test_a_busy_entry_sends_on_and_takes_back_what_a_full_copy_refuses(
    copy_status: int, answered_by: str
) -> None:
    hits: list[int] = []

    async def copy_answers(request: web.Request) -> web.Response:
        hits.append(1)
        return web.json_response({"by": "copy"}, status=copy_status, headers={"Retry-After": "1"})

    copy_app = web.Application()
    copy_app.router.add_post(ROUTE, copy_answers)
    copy = await _serve(copy_app)

    entered, release = asyncio.Event(), asyncio.Event()

    async def here(request: web.Request) -> web.Response:
        entered.set()
        await release.wait()
        return web.json_response({"by": "entry"})

    policy = ApiPolicy(
        token=None, max_body_bytes=1 << 20, max_concurrent_requests=8, retry_after_s=1
    )
    # the backend generates; routing a request by its model reads only its body
    answers = Answers(
        cast(Backend, None), Guard(policy, lambda route, status: None), lambda r: None
    )
    copy_address = f"127.0.0.1:{copy.port}"
    model = ServedModel(
        name="m",
        model_id="0123456789abcdef",
        layers=30,
        coverage=Coverage(True, (), 30, 100.0),
        here=True,
        # the copy is far faster: a second request goes there while the first runs here
        copies=(Copy("entry", 10.0, 0, here=True), Copy(copy_address, 1.0, 0)),
    )
    routes = ModelRoutes(answers, lambda: (model,), connect_timeout_s=5.0)
    entry_app = web.Application()
    entry_app.router.add_post(ROUTE, routes.routed(here))
    entry = await _serve(entry_app)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    try:
        async with aiohttp.ClientSession() as http:

            async def ask() -> tuple[int, str]:
                async with http.post(f"http://127.0.0.1:{entry.port}{ROUTE}", json=body) as r:
                    return r.status, (await r.json())["by"]

            first = asyncio.ensure_future(ask())
            await asyncio.wait_for(entered.wait(), 10)  # held at the entry: it is busy
            second = asyncio.ensure_future(ask())
            await until(lambda: hits, "the second request reaching the copy", 10, every_s=0.01)
            release.set()
            assert await first == (200, "entry")
            status, by = await second
    finally:
        await routes.close()
        await entry.close()
        await copy.close()
    assert by == answered_by
    assert status == (200 if answered_by == "entry" else copy_status)
    assert len(hits) == 1
