"""The node's HTTP routes that people and clients use: OpenAI-compatible completions,
Anthropic's Messages API at /v1/messages, Ollama's API under /api/, /status, /metrics, the
dashboard at / and the chat page at /chat."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from importlib import resources
from typing import Any

from aiohttp import web

from swarm.api.activity import RecentRequests
from swarm.api.answers import Answers
from swarm.api.anthropic import AnthropicHandlers
from swarm.api.backend import Backend, Health
from swarm.api.embeddings import EmbeddingHandlers
from swarm.api.errors import anthropic_body, model_not_found, ollama_body, response
from swarm.api.guard import ApiPolicy, Guard, Handler
from swarm.api.metrics import CONTENT_TYPE, ApiMetrics
from swarm.api.ollama import OllamaHandlers
from swarm.api.openai import CompletionHandlers
from swarm.api.unknown_routes import json_errors
from swarm.schema import ApiReport, NodeStatus, RequestRecord, to_json


class Api:
    """The API's own state beside the backend: its guard, recent requests and metrics.
    `node_status` is what the rest of the node reports; the API adds its own part."""

    def __init__(
        self, backend: Backend, policy: ApiPolicy, node_status: Callable[[], NodeStatus]
    ) -> None:
        self.backend = backend
        self._node_status = node_status
        self.recent = RecentRequests()
        self.metrics = ApiMetrics(self.status)
        self.guard = Guard(policy, self.metrics.count)
        self.metrics.in_flight.set_function(lambda: self.guard.in_flight)
        self.metrics.queued.set_function(lambda: self.guard.queued)
        answers = Answers(backend, self.guard, self.finished)
        self.completions = CompletionHandlers(answers)
        self.ollama = OllamaHandlers(answers)
        self.anthropic = AnthropicHandlers(answers)
        self.embeddings = EmbeddingHandlers(answers)

    def finished(self, record: RequestRecord) -> None:
        self.recent.add(record)
        self.metrics.observe(record)

    def status(self) -> NodeStatus:
        policy = self.guard.policy
        report = ApiReport(
            in_flight=self.guard.in_flight,
            max_concurrent_requests=policy.max_concurrent_requests,
            token_required=policy.token is not None,
            queued=self.guard.queued,
            queue_size=policy.queue_size,
        )
        return dataclasses.replace(
            self._node_status(), api=report, recent_requests=self.recent.snapshot()
        )

    def health(self) -> Health:
        if not (self.guard.accepting and self.backend.accepting):
            return Health(False, "this node is leaving the swarm")
        missing = self._node_status().coverage.missing
        if missing:
            spans = ", ".join(f"{a}:{b}" for a, b in missing)
            return Health(False, f"no live node serves layers {spans}", missing)
        return Health(True)


def add_routes(
    app: web.Application,
    backend: Backend,
    policy: ApiPolicy,
    node_status: Callable[[], NodeStatus],
) -> Api:
    api = Api(backend, policy, node_status)
    app.middlewares.append(json_errors)  # a route no handler takes: OpenAI's error JSON
    protect = api.guard.protect
    handlers = api.completions
    app.router.add_post("/v1/chat/completions", protect("chat", handlers.chat))
    app.router.add_post("/v1/completions", protect("completions", handlers.completions))
    # Anthropic's Messages API: the same token check, errors in Anthropic's shape
    messages = protect("anthropic_messages", api.anthropic.messages, anthropic_body)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/embeddings", protect("embeddings", api.embeddings.openai))

    def model() -> dict[str, Any]:
        """The one model, with its context and which of its layers the swarm serves now."""
        return {
            "id": backend.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "swarm",
            "context_length": backend.context_tokens,
            "max_model_len": backend.context_tokens,  # vLLM's name for the same
            "coverage": to_json(node_status().coverage),
        }

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [model()]})

    async def one_model(request: web.Request) -> web.Response:
        """OpenAI's retrieve-model route: the model by its id, else a 404 naming it."""
        asked = request.match_info["id"]
        if asked != backend.model_name:
            return response(model_not_found(asked, backend.model_name))
        return web.json_response(model())

    app.router.add_get("/v1/models", protect("models", models))
    app.router.add_get("/v1/models/{id:.+}", protect("models", one_model))
    _add_ollama_routes(app, api)

    async def status(request: web.Request) -> web.Response:
        return web.json_response(to_json(api.status()))

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=api.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    # The page holds no data: its script fetches /status with the token from the page's
    # fragment (#token=...), which browsers never send to the server.
    pages = {
        name: resources.files("swarm.api").joinpath(f"{name}.html").read_bytes()
        for name in ("dashboard", "chat")
    }

    async def dashboard(request: web.Request) -> web.Response:
        return web.Response(body=pages["dashboard"], content_type="text/html", charset="utf-8")

    async def chat_page(request: web.Request) -> web.Response:
        """The chat page; like the dashboard it holds no data and asks the API for it."""
        return web.Response(body=pages["chat"], content_type="text/html", charset="utf-8")

    async def health(request: web.Request) -> web.Response:
        """No token needed: what a load balancer or a service manager polls. It tells no more
        than whether this node can serve, and which layers are missing when it cannot."""
        state = api.health()
        body: dict[str, Any] = {"status": "ok" if state.ready else "unavailable"}
        if not state.ready:
            body["reason"] = state.reason
            body["missing_layers"] = [list(span) for span in state.missing]
        return web.json_response(body, status=200 if state.ready else 503)

    app.router.add_get("/health", health)
    app.router.add_get("/status", protect("status", status))
    app.router.add_get("/metrics", protect("metrics", metrics))
    app.router.add_get("/", dashboard)
    app.router.add_get("/chat", chat_page)
    return api


def _add_ollama_routes(app: web.Application, api: Api) -> None:
    """Ollama's routes, behind the same token check, with errors in Ollama's shape."""
    ollama = api.ollama

    def protect(route: str, handler: Handler) -> Handler:
        return api.guard.protect(route, handler, ollama_body)

    for method, path, route, handler in ollama.routes():
        app.router.add_route(method, path, protect(route, handler))
    # the rest of /api/: aiohttp tries a path's own route before this one
    app.router.add_route("*", "/api/{rest:.*}", protect("ollama_other", ollama.elsewhere))
