"""Reading a request body without trusting its sender: refused from Content-Length before a
byte is read, and never more than the limit buffered when the length is not declared. (The
HTTP server bounds how long a peer route's body may take, and how many are read at once.)"""

from __future__ import annotations

from aiohttp import web


class BodyTooLarge(Exception):
    """The body is over the endpoint's limit; answer 413."""


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, or BodyTooLarge as soon as it is known to exceed `limit` bytes."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise BodyTooLarge(f"a body of {declared} bytes is over the limit of {limit}")
    parts: list[bytes] = []
    size = 0
    while True:
        # read() may return less than asked (one TCP segment): loop until the end
        part = await request.content.read(limit + 1 - size)
        if not part:
            return b"".join(parts)
        size += len(part)
        if size > limit:
            raise BodyTooLarge(f"a body of more than {limit} bytes is over the limit")
        parts.append(part)
