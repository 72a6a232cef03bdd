"""A small HTTP client for a running swarm: streaming chat and completions, and status. Used by
the CLI."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from swarm.errors import LinkError, NoChatTemplateError, RefusedError, SwarmError
from swarm.sampling_settings import SamplingSettings
from swarm.schema import NodeStatus, from_json


def sampling_fields(settings: SamplingSettings) -> dict[str, Any]:
    """The request body's fields for `settings` that the command line can set."""
    return {
        "max_tokens": settings.max_tokens,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "top_k": settings.top_k,
        "repetition_penalty": settings.repetition_penalty,
        "seed": settings.seed,
        "stop": list(settings.stop) or None,
    }


_BROKE_OFF = "the answer broke off: the connection to"


class SwarmClient:
    def __init__(self, address: str, timeout_s: float = 600.0, token: str | None = None) -> None:
        self.base = f"http://{address}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)

    async def status(self) -> NodeStatus:
        """StatusFormatError when the node answers something that is not a status."""
        try:
            async with self._session() as http, http.get(f"{self.base}/status") as r:
                if r.status != 200:
                    raise await _refused(r)
                body = await r.json()
        except (aiohttp.ClientError, OSError) as e:
            raise LinkError(f"cannot reach the node at {self.base}: {e}") from None
        return from_json(NodeStatus, body)

    def chat(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Yield the stream's chunks (OpenAI format)."""
        return self._stream("/v1/chat/completions", body)

    def complete(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """A plain-prompt completion (no chat template): yield the stream's chunks."""
        return self._stream("/v1/completions", body)

    async def _stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The chunks up to the stream's [DONE]; LinkError where the node cannot be reached,
        or where its connection closes before [DONE] (the node was killed mid-answer)."""
        answering = False
        try:
            async with (
                self._session() as http,
                http.post(f"{self.base}{path}", json={**body, "stream": True}) as r,
            ):
                if r.status != 200:
                    raise await _refused(r)
                answering = True
                async for line in r.content:
                    text = line.decode().strip()
                    if text == "data: [DONE]":
                        return
                    if not text.startswith("data: "):
                        continue
                    chunk = json.loads(text[len("data: ") :])
                    if isinstance(chunk, dict) and "error" in chunk:  # the stream's last event
                        error = chunk["error"]
                        message = error.get("message") if isinstance(error, dict) else error
                        raise SwarmError(f"the answer broke off: {message}")
                    yield chunk
        except (aiohttp.ClientError, OSError) as e:
            if answering and isinstance(e, TimeoutError):
                total = self._timeout.total
                raise LinkError(
                    f"the answer from {self.base} did not end within {total:g} s"
                ) from None
            if answering:
                raise LinkError(f"{_BROKE_OFF} {self.base} closed mid-stream ({e})") from None
            raise LinkError(f"cannot reach the node at {self.base}: {e}") from None
        raise LinkError(f"{_BROKE_OFF} {self.base} closed before the end of the stream")


async def _refused(response: aiohttp.ClientResponse) -> SwarmError:
    code = None
    try:
        error = (await response.json()).get("error", {})
        message, code = error.get("message"), error.get("code")
    except (aiohttp.ContentTypeError, ValueError, AttributeError):
        message = (await response.text())[:200]
    if code == NoChatTemplateError.code:
        return NoChatTemplateError(str(message))
    return RefusedError(
        f"the node refused the request ({response.status}): {message}",
        response.status,
        _seconds(response.headers.get("Retry-After")),
    )


def _seconds(header: str | None) -> float | None:
    """Retry-After's delay in seconds; None without one, or for an HTTP date (swarm's
    nodes send seconds)."""
    try:
        seconds = float(header) if header is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < math.inf else None
