"""The node's HTTP routes that people and clients use."""

from __future__ import annotations

from aiohttp import web

from swarm.api.backend import Backend
from swarm.api.openai import CompletionHandlers


def add_routes(app: web.Application, backend: Backend) -> None:
    handlers = CompletionHandlers(backend)
    app.router.add_post("/v1/chat/completions", handlers.chat)
    app.router.add_post("/v1/completions", handlers.completions)
    app.router.add_get("/v1/models", handlers.models)

    async def status(request: web.Request) -> web.Response:
        return web.json_response(backend.status())

    app.router.add_get("/status", status)
