"""The entry side of a networked request: send each step to the first hop of the session's
route and wait for the last hop's result (or an error frame) under a deadline."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import torch

from swarm.config import NetConfig
from swarm.errors import HopFailedError, LinkError
from swarm.net.links import Links
from swarm.types import NodeId, SessionId
from swarm.wire import (
    CloseSession,
    Codec,
    ErrorCode,
    ErrorMessage,
    Hop,
    HopTiming,
    Peer,
    ResultMessage,
    StepMessage,
)

log = logging.getLogger(__name__)

_KEEP_TRACES = 100  # finished sessions whose route and timings stay visible
_BAN_S = 30.0  # seconds a hop that failed a step is left out of new routes

Reply = ResultMessage | ErrorMessage
RouteChooser = Callable[[frozenset[NodeId]], tuple[Hop, ...]]  # excluded peers -> route


@dataclass
class StepWaiters:
    """Steps in flight, keyed by (session, step); results and error frames resolve them."""

    _waiting: dict[tuple[str, int], asyncio.Future[Reply]] = field(default_factory=dict)

    def expect(self, session: SessionId, step: int) -> asyncio.Future[Reply]:
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiting[(session, step)] = future
        return future

    def resolve(self, reply: Reply) -> bool:
        """False when nobody waits for it (late, duplicate, or forged by a confused peer)."""
        future = self._waiting.pop((reply.session, reply.step), None)
        if future is None or future.done():
            return False
        future.set_result(reply)
        return True

    def forget(self, session: SessionId, step: int) -> None:
        self._waiting.pop((session, step), None)


@dataclass
class Trace:
    """The route a session took and the per-hop timings of its last step."""

    route: tuple[Hop, ...]
    timings: tuple[HopTiming, ...] = ()


class RemotePipeline:
    def __init__(
        self,
        me: Peer,
        links: Links,
        waiters: StepWaiters,
        choose_route: RouteChooser,
        config: NetConfig,
        codec: Codec = Codec.RAW,
    ) -> None:
        self._me = me
        self._links = links
        self._waiters = waiters
        self._choose_route = choose_route
        self._config = config
        self._codec = codec
        self._steps = itertools.count()
        self.traces: dict[SessionId, Trace] = {}  # sessions in flight
        self.finished: OrderedDict[SessionId, Trace] = OrderedDict()  # the last _KEEP_TRACES
        self._banned: dict[NodeId, float] = {}  # failed hops -> monotonic time the ban ends
        self._background: set[asyncio.Task[None]] = set()

    async def forward(
        self, session: SessionId, hidden: torch.Tensor, position: int
    ) -> torch.Tensor:
        trace = self.traces.get(session)
        if trace is None:
            trace = self.traces[session] = Trace(self._choose_route(self._excluded()))
        step = next(self._steps)
        first = trace.route[0]
        message = StepMessage(
            session, step, position, hidden, trace.route, self._me, (), self._codec
        )
        reply_future = self._waiters.expect(session, step)
        try:
            await self._links.send(first.address, message)
            async with asyncio.timeout(self._config.step_timeout_s):
                reply = await reply_future
        except LinkError as e:
            raise HopFailedError(str(e), first.node_id) from None
        except TimeoutError:
            raise HopFailedError(
                f"step {step} got no answer in {self._config.step_timeout_s} s"
            ) from None
        finally:
            self._waiters.forget(session, step)
        if isinstance(reply, ErrorMessage):
            # a hop that moved its span is healthy: re-route without banning it
            culprit = None if reply.code is ErrorCode.WRONG_SPAN else reply.failed_hop
            raise HopFailedError(f"hop {reply.failed_hop} failed: {reply.reason}", culprit)
        trace.timings = reply.timings
        return reply.hidden

    async def recover(self, session: SessionId, failed: NodeId | None) -> None:
        """Ban the failed hop for a while, drop the session from the old route's other hops,
        and let the next step choose a route without it."""
        now = time.monotonic()
        if failed is not None:
            self._banned[failed] = now + _BAN_S
        trace = self.traces.pop(session, None)
        if trace is not None:
            for hop in trace.route:
                if hop.node_id != failed:
                    self._spawn(self._close_on(hop, session))

    def _excluded(self) -> frozenset[NodeId]:
        now = time.monotonic()
        self._banned = {node: until for node, until in self._banned.items() if until > now}
        return frozenset(self._banned)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _close_on(self, hop: Hop, session: SessionId) -> None:
        try:
            await self._links.send(hop.address, CloseSession(session))
        except LinkError as e:
            log.info("could not close session %s on %s: %s", session, hop.node_id, e)

    async def close(self, session: SessionId) -> None:
        trace = self.traces.pop(session, None)
        if trace is None:
            return
        self.finished[session] = trace
        while len(self.finished) > _KEEP_TRACES:
            self.finished.popitem(last=False)
        for hop in trace.route:
            try:
                await self._links.send(hop.address, CloseSession(session))
            except LinkError as e:
                log.info("could not close session %s on %s: %s", session, hop.node_id, e)
