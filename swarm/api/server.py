"""The HTTP subsystem: the node's one port. It serves the API (completions, status, metrics,
the dashboard) and the routes other subsystems hand it (node-to-node links, gossip), and
stays up while the node drains, so streams in flight finish and /status answers to the end."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

from aiohttp import web

from swarm.api.app import Api, add_routes
from swarm.api.backend import Backend
from swarm.api.guard import ApiPolicy
from swarm.schema import NodeStatus

# a gossip full state fits well inside; API routes have their own, smaller api.max_body_bytes
_MAX_BODY_BYTES = 80 * 1024 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PeerRoute = tuple[Literal["GET", "POST"], str, Handler]  # (method, path, handler)


class HttpServer:
    def __init__(
        self,
        policy: ApiPolicy,
        backend: Backend,
        node_status: Callable[[], NodeStatus],
        peer_routes: Sequence[PeerRoute],
    ) -> None:
        app = web.Application(client_max_size=_MAX_BODY_BYTES)
        for method, path, handler in peer_routes:
            app.router.add_route(method, path, handler)
        self.api: Api = add_routes(app, backend, policy, node_status)
        self._runner = web.AppRunner(app, access_log=None)

    async def start(self, host: str, port: int) -> None:
        """Bind and serve from now on (before the other subsystems run, so peers that hear of
        this node can reach it at once)."""
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()

    async def run(self) -> None:
        """Requests are served by aiohttp's own tasks from `start` on."""

    async def drain(self) -> None:
        """Refuse new generations (503, "shutting down"), so a client tries another node; the
        server itself answers until `stop`, so streams in flight finish."""
        self.api.guard.accepting = False

    def status(self) -> NodeStatus:
        return self.api.status()

    async def stop(self) -> None:
        await self._runner.cleanup()
