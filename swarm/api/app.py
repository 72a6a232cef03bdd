"""The node's HTTP routes that people and clients use: OpenAI-compatible completions,
Anthropic's Messages API at /v1/messages, Ollama's API under /api/, /status, /metrics, the
dashboard at / and the chat page at /chat."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

from aiohttp import web

from swarm.api.activity import RecentRequests
from swarm.api.answers import Answers
from swarm.api.anthropic import AnthropicHandlers
from swarm.api.backend import Backend, Health
from swarm.api.embeddings import EmbeddingHandlers
from swarm.api.errors import anthropic_body, ollama_body, response
from swarm.api.guard import ApiPolicy, Guard, Handler
from swarm.api.metrics import CONTENT_TYPE, ApiMetrics
from swarm.api.model_routes import OLLAMA, ModelRoutes, model_entry, unknown_model
from swarm.api.ollama import OllamaHandlers
from swarm.api.openai import CompletionHandlers
from swarm.api.unknown_routes import json_errors
from swarm.model_routing import named
from swarm.schema import ApiReport, NodeStatus, RequestRecord, ServedModel, to_json


class Api:
    """The API's own state beside the backend: its guard, recent requests and metrics.
    `node_status` is what the rest of the node reports; the API adds its own part."""

    def __init__(
        self,
        backend: Backend,
        policy: ApiPolicy,
        node_status: Callable[[], NodeStatus],
        models: Callable[[], Sequence[ServedModel]],
    ) -> None:
        """`models`: the swarm's models as this node sees them now, its own first."""
        self.backend = backend
        self._node_status = node_status
        self.recent = RecentRequests()
        self.metrics = ApiMetrics(self.status)
        self.guard = Guard(policy, self.metrics.count)
        self.metrics.in_flight.set_function(lambda: self.guard.in_flight)
        self.metrics.queued.set_function(lambda: self.guard.queued)
        answers = Answers(backend, self.guard, self.finished)
        self.models = ModelRoutes(answers, models, policy.forward_connect_timeout_s)
        self.completions = CompletionHandlers(answers)
        self.ollama = OllamaHandlers(answers, self.models.listed)
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
    served: Callable[[], Sequence[ServedModel]],
) -> Api:
    """`served`: the swarm's models as this node sees them now, its own first."""
    api = Api(backend, policy, node_status, served)
    app.middlewares.append(json_errors)  # a route no handler takes: OpenAI's error JSON
    protect, routed = api.guard.protect, api.models.routed
    handlers = api.completions
    app.router.add_post("/v1/chat/completions", protect("chat", routed(handlers.chat)))
    completions = protect("completions", routed(handlers.completions))
    app.router.add_post("/v1/completions", completions)
    # Anthropic's Messages API: the same token check, errors in Anthropic's shape
    messages = protect("anthropic_messages", routed(api.anthropic.messages), anthropic_body)
    app.router.add_post("/v1/messages", messages)
    embeddings = protect("embeddings", routed(api.embeddings.openai))
    app.router.add_post("/v1/embeddings", embeddings)

    def model(served: ServedModel) -> dict[str, Any]:
        """A model, with which of its layers the swarm serves now; its context where this
        node serves it."""
        return model_entry(served, backend.context_tokens if served.here else None)

    async def models(request: web.Request) -> web.Response:
        listed = [model(m) for m in api.models.listed()]
        return web.json_response({"object": "list", "data": listed})

    async def one_model(request: web.Request) -> web.Response:
        """OpenAI's retrieve-model route: the model by its name, an alias or its id, else a
        404 naming the models served."""
        asked, listed = request.match_info["id"], api.models.listed()
        found = named(listed, asked)
        if found is None:
            return response(unknown_model(asked, listed))
        return web.json_response(model(found))

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
        if method == "POST":  # each names a model: `name` before `model` in /api/show's
            fields = ("name", "model") if path == "/api/show" else ("model",)
            handler = api.models.routed(handler, fields, OLLAMA)
        app.router.add_route(method, path, protect(route, handler))
    # the rest of /api/: aiohttp tries a path's own route before this one
    app.router.add_route("*", "/api/{rest:.*}", protect("ollama_other", ollama.elsewhere))
