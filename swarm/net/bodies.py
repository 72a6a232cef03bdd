"""Reading a request body without trusting its sender: refused from Content-Length before a
byte is read, and never more than the limit buffered when the length is not declared. The
node's HTTP server reads a peer route's body before the handler runs, within the route's
limit, a deadline and a slot (`swarm/api/server.py`); a handler finds it read."""

from __future__ import annotations

from aiohttp import web


class BodyTooLarge(Exception):
    """The body is over the endpoint's limit; answer 413."""


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, or BodyTooLarge as soon as it is known to exceed `limit` bytes."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise BodyTooLarge(f"a body of {declared} bytes is over the limit of {limit}")
    try:
        # read once per request and kept: the server's read, or this one, under the server's
        # cap (the route's limit where the server read it)
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        body = None
    if body is None or len(body) > limit:
        raise BodyTooLarge(f"a body of more than {limit} bytes is over the limit")
    return body
