"""A real aiohttp server on 127.0.0.1:0 in front of the real inference service running a tiny
random Llama in this process, and what the API tests send it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import openai
from aiohttp import web

from swarm.api.app import Api, add_routes
from swarm.api.guard import ApiPolicy
from swarm.config import RuntimeConfig
from swarm.inference.local import LocalSwarm, load_local
from swarm.inference.service import InferenceService
from swarm.schema import (
    Coverage,
    HopLoad,
    ModelInfo,
    NodeInfo,
    NodeLoad,
    NodeStatus,
    ServedModel,
)

TOKEN = "test-token-0123456789"
MODEL = "tiny"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "w5 w6 w7"}], "temperature": 0}


@dataclass
class Served:
    url: str
    api: Api
    local: LocalSwarm

    def kv_sessions(self) -> int:
        return sum(shard.kv.snapshot()[0] for shard in self.local.pipeline.shards)


def _status(local: LocalSwarm, service: InferenceService) -> Callable[[], NodeStatus]:
    """What a one-process "swarm" can say about itself, read from its shards and its head."""

    def status() -> NodeStatus:
        kv = [shard.kv.snapshot() for shard in local.pipeline.shards]
        layers = local.pipeline.shards[-1].span.end
        hop = HopLoad(kv_sessions=sum(k[0] for k in kv), kv_used_bytes=sum(k[1] for k in kv))
        load = NodeLoad(hop=hop)
        return NodeStatus(
            node=NodeInfo("local", "127.0.0.1:0", (0, layers), load),
            model=ModelInfo(MODEL, "tiny", layers),
            members=(),
            coverage=Coverage(True, (), layers, 0.0),
            speculation=service.head.drafts.report(""),
        )

    return status


def _served(status: NodeStatus) -> tuple[ServedModel, ...]:
    """The one model of a one-process "swarm", served here."""
    model = status.model
    return (ServedModel(model.name, model.id, model.layers, status.coverage, here=True),)


@contextlib.asynccontextmanager
async def serve(
    runtime: RuntimeConfig, policy: ApiPolicy, context: int = 256
) -> AsyncIterator[Served]:
    local = await load_local(runtime)
    service = InferenceService(
        MODEL, local.entry, local.pipeline, local.compute, max_prompt_tokens=context
    )
    app = web.Application()
    status = _status(local, service)
    api = add_routes(app, service, policy, status, lambda: _served(status()))
    runner = web.AppRunner(app, access_log=None)  # as the node runs it: no handler cancellation
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield Served(f"http://{host}:{port}", api, local)
    finally:
        await runner.cleanup()
        await api.models.close()
        local.compute.close()


def policy(**changes: Any) -> ApiPolicy:
    values: dict[str, Any] = dict(
        token=TOKEN, max_body_bytes=64 * 1024, max_concurrent_requests=4, retry_after_s=3
    )
    values.update(changes)
    return ApiPolicy(**values)


def openai_client(served: Served, token: str = TOKEN) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=served.url + "/v1", api_key=token, max_retries=0)


def post(body: bytes, token: str | None = TOKEN) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return {"data": body, "headers": headers}
