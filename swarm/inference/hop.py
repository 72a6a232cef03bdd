"""The serving side of a hop: run this node's layers for a step, then push the result
straight to the next hop, or back to the entry after the last layer. Failures become error
frames to the step's entry, never exceptions that stop the node."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from swarm.errors import (
    ActivationError,
    KVCacheFullError,
    LinkError,
    PositionMismatchError,
    SessionNotFoundError,
    SpanError,
    SwarmError,
)
from swarm.net.links import Links
from swarm.runtime.compute import ComputeThread
from swarm.runtime.serving import Serving
from swarm.telemetry import SpeedMeter
from swarm.types import NodeId, SessionId
from swarm.wire import (
    CloseSession,
    ErrorCode,
    ErrorMessage,
    HopTiming,
    ResultMessage,
    StepMessage,
)

log = logging.getLogger(__name__)

_ERROR_CODES: list[tuple[type[SwarmError], ErrorCode]] = [
    (SessionNotFoundError, ErrorCode.SESSION_NOT_FOUND),
    (PositionMismatchError, ErrorCode.POSITION_MISMATCH),
    (KVCacheFullError, ErrorCode.KV_CACHE_FULL),
    (SpanError, ErrorCode.WRONG_SPAN),
    (ActivationError, ErrorCode.BAD_FRAME),
]


@dataclass
class HopServer:
    node_id: NodeId
    serving: Serving  # the shards this node serves now (they change when it moves)
    compute: ComputeThread
    links: Links
    slowdown: Callable[[], float]  # >= 1; simulated background load
    speed: SpeedMeter  # fed from every step this node runs

    async def step(self, message: StepMessage, wire_ms: float) -> None:
        """`wire_ms`: what authenticating and decoding the incoming frame took."""
        hop = message.route[0]
        try:
            if hop.node_id != self.node_id:
                raise SpanError(f"step addressed to {hop.node_id}, this is {self.node_id}")
            queued = time.perf_counter()
            hidden, started, finished = await self.compute.run(
                _timed_forward, self.serving, message, self.slowdown()
            )
        except SwarmError as e:
            await self._fail(message, _code(e), str(e), self.node_id)
            return
        own_ms = (finished - started) * 1000 / self.slowdown()  # records carry slowdown apart
        self.speed.record(len(hop.span), message.hidden.shape[1], own_ms)
        timing = HopTiming(
            self.node_id,
            queue_ms=(started - queued) * 1000,
            compute_ms=(finished - started) * 1000,
            wire_ms=wire_ms,
        )
        await self._forward(message, hidden, (*message.timings, timing))

    async def _forward(
        self, message: StepMessage, hidden: torch.Tensor, timings: tuple[HopTiming, ...]
    ) -> None:
        entry = message.entry
        rest = message.route[1:]
        if rest:
            onward = StepMessage(
                message.session,
                message.step,
                message.position,
                hidden,
                rest,
                entry,
                timings,
                message.codec,
            )
            try:
                await self.links.send(rest[0].address, onward)
            except LinkError as e:
                await self._fail(message, ErrorCode.HOP_UNREACHABLE, str(e), rest[0].node_id)
            return
        result = ResultMessage(
            message.session, message.step, message.position, hidden[:, -1:], timings, message.codec
        )
        try:
            await self.links.send(entry.address, result)
        except LinkError as e:
            log.warning(
                "cannot return step %d of %s to its entry: %s", message.step, message.session, e
            )

    async def close(self, message: CloseSession) -> None:
        await self.compute.run(_close_everywhere, self.serving, message.session)

    async def _fail(
        self, message: StepMessage, code: ErrorCode, reason: str, failed: NodeId
    ) -> None:
        entry = message.entry
        error = ErrorMessage(message.session, message.step, code, reason, failed)
        try:
            await self.links.send(entry.address, error)
        except LinkError as e:
            log.warning("cannot report a failed step to entry %s: %s", entry.address, e)


def _close_everywhere(serving: Serving, session: SessionId) -> None:
    for shard in serving.all():
        shard.close_session(session)


def _timed_forward(
    serving: Serving, message: StepMessage, slowdown: float
) -> tuple[torch.Tensor, float, float]:
    """Runs on the compute thread. A slowdown k holds the thread (k - 1) times the compute
    time longer, as a machine k times slower would."""
    started = time.perf_counter()
    session, layers = SessionId(message.session), message.route[0].span
    shard = serving.shard_for(session, layers)
    if shard is None:
        raise SpanError(f"this node does not serve layers {layers} now")
    hidden = shard.forward(session, message.hidden, message.position, layers)
    finished = time.perf_counter()
    if slowdown > 1.0:
        time.sleep((slowdown - 1.0) * (finished - started))
        finished = time.perf_counter()
    return hidden, started, finished


def _code(error: SwarmError) -> ErrorCode:
    for kind, code in _ERROR_CODES:
        if isinstance(error, kind):
            return code
    return ErrorCode.INTERNAL
