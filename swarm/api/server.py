"""The HTTP subsystem: the node's one port. It serves the API (completions, status, metrics,
the dashboard) and the routes other subsystems hand it (node-to-node links, gossip), and
stays up while the node drains, so streams in flight finish and /status answers to the end.

Peer routes are open to anyone who can reach the port until their handler checks the swarm
secret, so each carries its own body limit (refused from Content-Length before a byte is
read), and a body must arrive within `net.unauthenticated_body_timeout_s` while it holds one
of a few slots: `net.max_unauthenticated` for addresses no member advertises, at most
`net.max_unauthenticated_per_address` of them per address, and a lane of their own for the
members' addresses, so strangers that trickle bodies never keep members' gossip waiting.
The slot is given back once the body is read, before the handler authenticates it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, NamedTuple

from aiohttp import web

from swarm.api.app import Api, add_routes
from swarm.api.backend import Backend
from swarm.api.connections import (
    ConnectionCaps,
    ConnectionGate,
    GatedSite,
    raise_descriptor_limit,
)
from swarm.api.guard import ApiPolicy
from swarm.config import NetConfig
from swarm.logs import Refusals, merge_counts
from swarm.schema import NodeStatus, RefusedPeer, ServedModel

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
KIB = 1024
MIB = 1024 * KIB
# A peer route's body limit when it names none: gossip-sized
DEFAULT_PEER_BODY_BYTES = 4 * MIB


class PeerRoute(NamedTuple):
    """A route another subsystem serves to peers, with the largest body it takes (a
    websocket's messages have their own limit, set where the socket is made)."""

    method: Literal["GET", "POST"]
    path: str
    handler: Handler
    max_body_bytes: int = DEFAULT_PEER_BODY_BYTES


class Slots:
    """Requests being read from each address, within a cap per address and one in all."""

    def __init__(self, per_address: int, total: int | None = None) -> None:
        self._per_address = per_address
        self._total = total  # None: no cap in all
        self._reading: Counter[str] = Counter()

    def take(self, address: str) -> bool:
        full = self._total is not None and self._reading.total() >= self._total
        if full or self._reading[address] >= self._per_address:
            return False
        self._reading[address] += 1
        return True

    def give(self, address: str) -> None:
        self._reading[address] -= 1
        if self._reading[address] <= 0:
            del self._reading[address]


def _nobody(host: str) -> bool:
    return False


class HttpServer:
    def __init__(
        self,
        policy: ApiPolicy,
        backend: Backend,
        node_status: Callable[[], NodeStatus],
        models: Callable[[], Sequence[ServedModel]],
        peer_routes: Sequence[PeerRoute],
        net: NetConfig | None = None,
        refusals: Sequence[Refusals] = (),
        member_host: Callable[[str], bool] = _nobody,
    ) -> None:
        """`member_host`: whether a peer address is one a member of the swarm advertises (its
        requests read in the members' lane); `models`: the swarm's models as this node sees
        them now, its own first."""
        net = net or NetConfig()
        self.refusals = Refusals(log, "a request")
        self._counted = (self.refusals, *refusals)
        self._net = net
        self._limits: dict[tuple[str, str], int] = {
            (r.method, r.path): r.max_body_bytes for r in peer_routes
        }
        self._member_host = member_host
        self._strangers = Slots(net.max_unauthenticated_per_address, net.max_unauthenticated)
        self._members = Slots(net.max_unauthenticated)
        limit = max([policy.max_body_bytes, *self._limits.values()])
        app = web.Application(client_max_size=limit, middlewares=[self._peer_limits])
        for route in peer_routes:
            app.router.add_route(route.method, route.path, route.handler)
        status = self._with_refusals(node_status)
        self.api: Api = add_routes(app, backend, policy, status, models)
        self._runner = web.AppRunner(
            app, access_log=None, keepalive_timeout=net.idle_timeout_s, max_headers=64
        )
        caps = ConnectionCaps(
            net.max_connections,
            net.max_connections_per_address,
            net.header_timeout_s,
            net.max_unfinished_per_address,
        )
        self.gate = ConnectionGate(caps, self.refusals)

    def _with_refusals(self, node_status: Callable[[], NodeStatus]) -> Callable[[], NodeStatus]:
        def status() -> NodeStatus:
            counts = merge_counts(*(r.counts for r in self._counted))
            now = time.monotonic()
            peers = sorted((p for r in self._counted for p in r.by_peer()), key=lambda p: -p.last)
            refused = tuple(
                RefusedPeer(p.peer, p.reason, p.what, p.count, round(now - p.last, 3))
                for p in peers
            )
            return dataclasses.replace(node_status(), refusals=counts, refused_from=refused)

        return status

    @web.middleware
    async def _peer_limits(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        limit = self._limits.get((request.method, request.path))
        if limit is None:  # an API route: the guard checks the token before the body
            return await handler(request)
        peer = request.remote or "?"
        declared = request.content_length
        if declared is not None and declared > limit:
            self.refusals.refuse("body_too_large", peer, f"a body of {declared} bytes")
            return web.Response(status=413, text=f"the body is over this route's {limit} bytes")
        if request.method == "GET":  # a link: its hello authenticates it (Inbox), no body
            return await handler(request)
        slots = self._members if self._member_host(peer) else self._strangers
        if not slots.take(peer):
            self.refusals.refuse("busy", peer, "too many unauthenticated requests at once")
            return web.Response(status=503, text="busy", headers={"Retry-After": "1"})
        try:
            # read here, so the handler finds it read (`request.read()`): the slot and the
            # deadline cover the body, not the work of answering an authenticated request
            read = request.clone(client_max_size=limit)
            async with asyncio.timeout(self._net.unauthenticated_body_timeout_s):
                await read.read()
        except TimeoutError:
            self.refusals.refuse("body_timeout", peer, "the body did not arrive in time")
            return web.Response(status=408, text="the body did not arrive in time")
        except web.HTTPRequestEntityTooLarge:
            self.refusals.refuse("body_too_large", peer, f"a body of more than {limit} bytes")
            return web.Response(status=413, text=f"the body is over this route's {limit} bytes")
        finally:
            slots.give(peer)
        return await handler(read)

    async def start(self, sock: socket.socket) -> None:
        """Listen on `sock` (bound) and serve from now on (before the other subsystems run, so
        peers that hear of this node can reach it at once)."""
        self.gate.caps = raise_descriptor_limit(self.gate.caps)
        await self._runner.setup()
        await GatedSite(self._runner, sock, self.gate).start()

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
        await self.api.models.close()
