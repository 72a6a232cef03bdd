"""Hands each frame from the inbox to its handler: steps and closes to the hop server,
results and errors to the entry's waiting steps, an entry's request to reload this node's
layers to the reloader. Each step runs in its own task, so one slow
step never holds up the frames behind it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from swarm.inference.waiters import StepWaiters
from swarm.net.endpoint import Inbox
from swarm.net.probes import RoundTrips
from swarm.wire import (
    CloseSession,
    ErrorMessage,
    LinkProbe,
    NodeId,
    ProbeReply,
    ReloadLayers,
    ResultMessage,
    StepMessage,
)

log = logging.getLogger(__name__)


class StepHandler(Protocol):
    """The hop server, or what stands in front of it while the node leaves."""

    async def step(self, message: StepMessage, wire_ms: float, decoded_at: float) -> None: ...

    async def close(self, message: CloseSession) -> None: ...


# the sender (authenticated by its frame) and its request
ReloadHandler = Callable[[NodeId, ReloadLayers], Coroutine[Any, Any, None]]


async def serve_inbox(
    inbox: Inbox,
    hop: StepHandler,
    waiters: StepWaiters,
    round_trips: RoundTrips,
    reload: ReloadHandler,
) -> None:
    running: set[asyncio.Task[None]] = set()
    try:
        while True:
            received, decode_ms, decoded_at = await inbox.queue.get()
            message = received.message
            if isinstance(message, LinkProbe):
                round_trips.answer(message)
                continue
            if isinstance(message, ProbeReply):
                round_trips.resolve(received.sender, message)
                continue
            if isinstance(message, (ResultMessage, ErrorMessage)):
                if not waiters.resolve(message, decoded_at):
                    log.debug("no step waits for %s %s", message.session, message.step)
                continue
            if isinstance(message, StepMessage):
                task = asyncio.create_task(hop.step(message, decode_ms, decoded_at))
            elif isinstance(message, CloseSession):
                task = asyncio.create_task(hop.close(message))
            elif isinstance(message, ReloadLayers):
                task = asyncio.create_task(reload(received.sender, message))
            else:
                log.debug("ignoring %s from %s", type(message).__name__, received.sender)
                continue
            running.add(task)
            task.add_done_callback(_finished(running))
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


def _finished(running: set[asyncio.Task[None]]):  # type: ignore[no-untyped-def]
    def done(task: asyncio.Task[None]) -> None:
        running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("frame handler failed", exc_info=task.exception())

    return done
