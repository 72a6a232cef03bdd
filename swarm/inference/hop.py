"""The serving side of a hop: run this node's layers for a step, then push the result
straight to the next hop, or back to the entry after the last layer. Failures become error
frames to the step's entry, never exceptions that stop the node."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

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
from swarm.inference.batching import DecodeBatcher, PrefillBatcher, StepRun
from swarm.net.links import Links
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.serving import Serving
from swarm.schema import HopTimes
from swarm.telemetry import SpeedMeter
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
    (KVCacheFullError, ErrorCode.KV_CACHE_FULL),
    (SpanError, ErrorCode.WRONG_SPAN),
    (ActivationError, ErrorCode.BAD_FRAME),
]


_RESULT_ATTEMPTS = 3  # tries at returning a step's result to its entry
_RESULT_RETRY_S = 0.5  # seconds times the attempt number between them
_REMEMBERED_SESSIONS = 4096  # sessions whose last step number a hop keeps, for de-duplication


@dataclass
class HopServer:
    node_id: NodeId
    serving: Serving  # the shards this node serves now (they change when it moves)
    compute: ComputeThread
    links: Links
    speed: SpeedMeter  # fed from every step this node runs
    batcher: DecodeBatcher | None  # None: every step runs alone
    prefill: PrefillBatcher | None = None  # None: every prefill chunk runs alone
    # The highest step number seen per session. An entry numbers its steps in increasing
    # order, so a step at or below it is a duplicate or a straggler from a route the entry has
    # given up on (e.g. a frozen hop that woke up): running it would corrupt the session's
    # cache, which the replay on the new route has rebuilt.
    _last_step: OrderedDict[SessionId, int] = field(default_factory=OrderedDict)
    # milliseconds encoding and writing each session's last frame on, for its next timing
    _last_send_ms: dict[SessionId, float] = field(default_factory=dict)
    # steps are also taken on the compute thread (thread_steps.py): _last_step is shared
    _seen_lock: threading.Lock = field(default_factory=threading.Lock)

    async def step(self, message: StepMessage, wire_ms: float, decoded_at: float) -> None:
        """`wire_ms`: what authenticating and decoding the incoming frame took; `decoded_at`:
        perf_counter when that ended."""
        taken = time.perf_counter()
        hop = message.route[0]
        if not self.is_new(message):
            log.info("dropping stale step %d of %s", message.step, message.session)
            return
        try:
            if hop.node_id != self.node_id:
                raise SpanError(f"step addressed to {hop.node_id}, this is {self.node_id}")
            queued = time.perf_counter()
            # a verify step's rows are one session's consecutive positions, each computed as
            # its own decode step, not a prefill chunk: it joins the decode steps' batch
            if _decodes(message) and self.batcher is not None:
                run = await self.batcher.run(message)
            elif not _decodes(message) and self.prefill is not None:
                run = await self.prefill.run(message)
            else:
                run = await self.compute.run(_timed_forward, self.serving, message)
        except SwarmError as e:
            await self._fail(message, _code(e), str(e), self.node_id)
            return
        resumed = time.perf_counter()
        if run.first:
            # one sample per batch: the wall time a stream's step took here. Under steady load
            # every step is batched, and a pace taken from lone steps only never saw the
            # machine slow down (a node capped mid-run kept announcing its idle pace).
            own_ms = (run.finished - run.started) * 1000
            tokens = run.tokens or message.hidden.shape[1]
            if not _decodes(message):
                self.speed.record_prefill(len(hop.span), tokens, own_ms)
            elif run.paced:  # as many rows as the call ran together
                self.speed.record_decode(len(hop.span), tokens, own_ms)
        timing = HopTimes(
            self.node_id,
            queue=(run.started - queued) * 1000,
            compute=(run.finished - run.started) * 1000,
            wire=wire_ms,
            dispatch=(taken - decoded_at) * 1000,
            resume=(resumed - run.finished) * 1000,
            send=self._last_send_ms.pop(SessionId(message.session), 0.0),
        )
        await self._forward(message, run.hidden, (*message.timings, timing))
        self._last_send_ms[SessionId(message.session)] = (time.perf_counter() - resumed) * 1000

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

    def is_new(self, message: StepMessage) -> bool:
        """Whether `message` is the newest step of its session seen so far (then it is
        remembered); callable from the compute thread too."""
        session = SessionId(message.session)
        with self._seen_lock:
            last = self._last_step.get(session)
            if last is not None and message.step <= last:
                return False
            self._last_step[session] = message.step
            self._last_step.move_to_end(session)
            while len(self._last_step) > _REMEMBERED_SESSIONS:
                forgotten, _ = self._last_step.popitem(last=False)
                self._last_send_ms.pop(forgotten, None)
        return True

    async def close(self, message: CloseSession) -> None:
        self._last_send_ms.pop(SessionId(message.session), None)
        await self.compute.run(_close_everywhere, self.serving, message.session)

    async def fail(self, message: StepMessage, error: SwarmError) -> None:
        """Tell `message`'s entry that it failed here with `error`."""
        await self._fail(message, _code(error), str(error), self.node_id)

    async def _fail(
        self, message: StepMessage, code: ErrorCode, reason: str, failed: NodeId
    ) -> None:
        entry = message.entry
        error = ErrorMessage(message.session, message.step, code, reason, failed)
        try:
            await self.links.send(entry.address, error)
        except LinkError as e:
            log.warning("cannot report a failed step to entry %s: %s", entry.address, e)


def onward(
    message: StepMessage, hidden: torch.Tensor, timings: tuple[HopTimes, ...]
) -> StepMessage | ResultMessage:
    """What a step becomes after this hop's layers: the step for the rest of its route, or,
    after the last hop, its result for the entry (the last position, every one for a verify
    step)."""
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
        )
    rows = hidden if message.verify else hidden[:, -1:]
    session, step, position = message.session, message.step, message.position
    return ResultMessage(session, step, position, rows, timings, message.codec, message.verify)


# the route after its first hop: the same tuple for the same route (the decoder keeps one
# per route it reads), so what the encoder keeps per route object serves every step
_RESTS: IdentityMemo[tuple[Hop, ...], tuple[Hop, ...]] = IdentityMemo(1024)


def _close_everywhere(serving: Serving, session: SessionId) -> None:
    for shard in serving.all():
        shard.close_session(session)


def _decodes(message: StepMessage) -> bool:
    """Whether `message` is a decode step (one position) or a verify step (every position as
    its own decode step would compute it), not a prefill chunk."""
    return message.verify or message.hidden.shape[1] == 1


def _timed_forward(serving: Serving, message: StepMessage) -> StepRun:
    """Runs on the compute thread."""
    started = time.perf_counter()
    session, layers = SessionId(message.session), message.route[0].span
    shard = serving.shard_for(session, layers)
    if shard is None:
        raise SpanError(f"this node does not serve layers {layers} now")
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
