"""The serving side of a hop: run this node's layers for a step, then push the result
straight to the next hop, or back to the entry after the last layer. Failures become error
frames to the step's entry, never exceptions that stop the node."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import torch

from swarm.errors import (
    ActivationError,
    KVCacheFullError,
    LinkError,
    PositionMismatchError,
    PrefixMissingError,
    SessionNotFoundError,
    SpanError,
    SwarmError,
)
from swarm.inference.batching import (
    DecodeBatcher,
    PrefillBatcher,
    StepRun,
    start_from_kept_blocks,
)
from swarm.inference.hop_ledger import Arrival, HopLedger, decodes
from swarm.net.links import Links
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.serving import Serving
from swarm.schema import HopTimes
from swarm.types import NodeId, SessionId
from swarm.wire import (
    CloseSession,
    ErrorCode,
    ErrorMessage,
    Hop,
    ResultMessage,
    StepMessage,
)
from swarm.wire.memo import IdentityMemo

log = logging.getLogger(__name__)

_ERROR_CODES: list[tuple[type[SwarmError], ErrorCode]] = [
    (SessionNotFoundError, ErrorCode.SESSION_NOT_FOUND),
    (PositionMismatchError, ErrorCode.POSITION_MISMATCH),
    (PrefixMissingError, ErrorCode.PREFIX_MISSING),
    (KVCacheFullError, ErrorCode.KV_CACHE_FULL),
    (SpanError, ErrorCode.WRONG_SPAN),
    (ActivationError, ErrorCode.BAD_FRAME),
]


_RESULT_ATTEMPTS = 3  # tries at returning a step's result to its entry
_RESULT_RETRY_S = 0.5  # seconds times the attempt number between them


@dataclass
class HopServer:
    node_id: NodeId
    serving: Serving  # the shards this node serves now (they change when it moves)
    compute: ComputeThread
    links: Links
    ledger: HopLedger  # de-duplication, timings and pace, shared with the compute thread's path
    batcher: DecodeBatcher | None  # None: every step runs alone
    prefill: PrefillBatcher | None = None  # None: every prefill chunk runs alone

    async def step(self, message: StepMessage, wire_ms: float, decoded_at: float) -> None:
        """`wire_ms`: what authenticating and decoding the incoming frame took; `decoded_at`:
        perf_counter when that ended."""
        arrival = Arrival(wire_ms, decoded_at, time.perf_counter())
        hop = message.route[0]
        if not self.ledger.is_new(message):
            log.info("dropping stale step %d of %s", message.step, message.session)
            return
        try:
            if hop.node_id != self.node_id:
                raise SpanError(f"step addressed to {hop.node_id}, this is {self.node_id}")
            queued = time.perf_counter()
            # a verify step's rows are one session's consecutive positions, each computed as
            # its own decode step, not a prefill chunk: it joins the decode steps' batch
            if decodes(message) and self.batcher is not None:
                run = await self.batcher.run(message)
            elif not decodes(message) and self.prefill is not None:
                run = await self.prefill.run(message)
            else:
                run = await self.compute.run(_timed_forward, self.serving, message)
        except SwarmError as e:
            held = e.held if isinstance(e, PrefixMissingError) else None
            await self._fail(message, _code(e), str(e), self.node_id, held)
            return
        resumed = time.perf_counter()
        self.ledger.pace(message, run)
        timing = self.ledger.timing(message, arrival, queued, run, resumed)
        await self._forward(message, run.hidden, (*message.timings, timing))
        self.ledger.sent(message, resumed)
        if message.block:  # after the step went on: keeping it delays no hop
            await self.compute.run(_keep_block, self.serving, message)

    async def _forward(
        self, message: StepMessage, hidden: torch.Tensor, timings: tuple[HopTimes, ...]
    ) -> None:
        await self.send_onward(message, onward(message, hidden, timings))

    async def send_onward(self, message: StepMessage, out: StepMessage | ResultMessage) -> None:
        """Send what `message` became here to the next hop, or its result to its entry."""
        if isinstance(out, StepMessage):
            try:
                await self.links.send(out.route[0].address, out)
            except LinkError as e:
                await self._fail(message, ErrorCode.HOP_UNREACHABLE, str(e), out.route[0].node_id)
            return
        # the entry waits for this result, and while every hop answers its probes it waits
        # up to net.step_timeout_s: a link that a lost packet kept from opening is tried
        # again rather than the result dropped
        for attempt in range(1, _RESULT_ATTEMPTS + 1):
            try:
                await self.links.send(message.entry.address, out)
                return
            except LinkError as e:
                log.warning(
                    "cannot return step %d of %s to its entry (attempt %d of %d): %s",
                    message.step,
                    message.session,
                    attempt,
                    _RESULT_ATTEMPTS,
                    e,
                )
            if attempt < _RESULT_ATTEMPTS:
                await asyncio.sleep(_RESULT_RETRY_S * attempt)

    async def close(self, message: CloseSession) -> None:
        self.ledger.forget(SessionId(message.session))
        await self.compute.run(_close_everywhere, self.serving, message.session)

    async def fail(self, message: StepMessage, error: SwarmError) -> None:
        """Tell `message`'s entry that it failed here with `error`."""
        await self._fail(message, _code(error), str(error), self.node_id)

    async def _fail(
        self,
        message: StepMessage,
        code: ErrorCode,
        reason: str,
        failed: NodeId,
        held: int | None = None,
    ) -> None:
        """`held`: for PREFIX_MISSING, the step's kept blocks this hop does hold."""
        entry = message.entry
        error = ErrorMessage(message.session, message.step, code, reason, failed, held)
        try:
            await self.links.send(entry.address, error)
        except LinkError as e:
            log.warning("cannot report a failed step to entry %s: %s", entry.address, e)


def onward(
    message: StepMessage, hidden: torch.Tensor, timings: tuple[HopTimes, ...]
) -> StepMessage | ResultMessage:
    """What a step becomes after this hop's layers: the step for the rest of its route, or,
    after the last hop, its result for the entry (the last position, every one for a verify
    step or where the step asks for every row)."""
    rest = _RESTS.get(message.route, lambda route: route[1:])
    if rest:
        return StepMessage(
            message.session,
            message.step,
            message.position,
            hidden,
            rest,
            message.entry,
            timings,
            message.codec,
            message.verify,
            message.prefix,
            message.block,
            message.every_row,
        )
    rows = hidden if message.verify or message.every_row else hidden[:, -1:]
    session, step, position = message.session, message.step, message.position
    return ResultMessage(session, step, position, rows, timings, message.codec, message.verify)


# the route after its first hop: the same tuple for the same route (the decoder keeps one
# per route it reads), so what the encoder keeps per route object serves every step
_RESTS: IdentityMemo[tuple[Hop, ...], tuple[Hop, ...]] = IdentityMemo(1024)


def _close_everywhere(serving: Serving, session: SessionId) -> None:
    for shard in serving.all():
        shard.close_session(session)


def _keep_block(serving: Serving, message: StepMessage) -> None:
    """Runs on the compute thread: the chunk's positions kept past the session. The session
    may be gone by now (closed, evicted): then there is nothing to keep."""
    session = SessionId(message.session)
    shard = serving.shard_for(session, message.route[0].span)
    if shard is None:
        return
    try:
        shard.kv.keep(session, message.block, message.position, message.hidden.shape[1])
    except SwarmError as e:
        log.debug("not keeping block %s of %s: %s", message.block, session, e)


def _timed_forward(serving: Serving, message: StepMessage) -> StepRun:
    """Runs on the compute thread."""
    started = time.perf_counter()
    session, layers = SessionId(message.session), message.route[0].span
    shard = serving.shard_for(session, layers)
    if shard is None:
        raise SpanError(f"this node does not serve layers {layers} now")
    if message.prefix:
        start_from_kept_blocks(shard, message)
    seq = message.hidden.shape[1]
    if not message.verify:
        hidden = shard.forward(session, message.hidden, message.position, layers)
        return StepRun(hidden, started, time.perf_counter(), tokens=seq)
    # every position as its own decode step would compute it
    run = shard.decode_rows([(session, message.hidden, message.position)], layers)
    (out,) = run.outputs
    if isinstance(out, SwarmError):
        raise out
    return StepRun(out, started, time.perf_counter(), tokens=seq, paced=run.shared)


def _code(error: SwarmError) -> ErrorCode:
    for kind, code in _ERROR_CODES:
        if isinstance(error, kind):
            return code
    return ErrorCode.INTERNAL
