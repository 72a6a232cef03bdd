"""One hop's core for a step, whichever thread runs it: the event loop (`HopServer`, for
steps that came over a websocket or wait on a batcher) or the compute thread (`ThreadSteps`,
for decode and verify steps read from fast links). Both take a step up with `admit`, run it,
and then, in this order: `depart` (its timing and what it becomes after this hop's layers),
one send (`send_now` from the compute thread, else `send` on the loop), `sent` (the last-send
ledger) and `pace` (once its frame has gone on: none of it is on the next hop's way).
Failures become error frames to the step's entry (`fail`), never exceptions that stop the
node."""

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
from swarm.inference.batching import StepRun
from swarm.inference.hop_ledger import Arrival, HopLedger
from swarm.net.links import Links
from swarm.runtime.execution.serving import Serving
from swarm.schema import HopTimes
from swarm.types import NodeId, SessionId
from swarm.wire import ErrorCode, ErrorMessage, Hop, ResultMessage, StepMessage
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


@dataclass(frozen=True)
class Departure:
    """A step after this hop's layers, on its way out."""

    message: StepMessage  # the step as it came to this hop
    out: StepMessage | ResultMessage  # the step for the rest of its route, or its result
    sending: float  # perf_counter when its sending began

    @property
    def address(self) -> str:
        """Where it goes: the next hop, or the step's entry."""
        if isinstance(self.out, StepMessage):
            return self.out.route[0].address
        return self.message.entry.address


@dataclass(frozen=True)
class HopCore:
    node_id: NodeId
    serving: Serving  # the shards this node serves now (they change when it moves)
    links: Links
    ledger: HopLedger  # de-duplication, timings, pace and the last send, for both threads

    def admit(self, message: StepMessage) -> bool:
        """Whether to run `message`: the newest step of its session so far. An older one is a
        duplicate or a straggler from a route its entry gave up on."""
        return self.ledger.is_new(message)

    def depart(
        self, message: StepMessage, arrival: Arrival, queued: float, run: StepRun, resumed: float
    ) -> Departure:
        """What `message` becomes after its `run` here, its timing added: `queued`
        (perf_counter) when it began to wait for the compute thread, `resumed` when its
        sender took the output up."""
        timing = self.ledger.timing(message, arrival, queued, run, resumed)
        sending = time.perf_counter()
        return Departure(message, onward(message, run.hidden, (*message.timings, timing)), sending)

    def send_now(self, departure: Departure) -> bool:
        """Send from the compute thread, on a fast link; False: not sent, `send` it on the
        event loop."""
        return self.links.send_now(departure.address, departure.out, wait=True)

    async def send(self, departure: Departure) -> None:
        """Send on the event loop. A next hop that cannot be reached is reported to the
        step's entry; a result the entry cannot be reached for is tried again."""
        message, out = departure.message, departure.out
        if isinstance(out, StepMessage):
            try:
                await self.links.send(departure.address, out)
            except LinkError as e:
                await self._report(message, ErrorCode.HOP_UNREACHABLE, str(e), out.route[0].node_id)
            return
        # the entry waits for this result, and while every hop answers its probes it waits
        # up to net.step_timeout_s: a link that a lost packet kept from opening is tried
        # again rather than the result dropped
        for attempt in range(1, _RESULT_ATTEMPTS + 1):
            try:
                await self.links.send(departure.address, out)
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

    def sent(self, departure: Departure) -> None:
        """The step's frame went on (or was handed to the loop to go on)."""
        self.ledger.sent(departure.message, departure.sending)

    def pace(self, message: StepMessage, run: StepRun) -> None:
        """The pace sample of `message`'s call, once its frame has gone on."""
        self.ledger.pace(message, run)

    async def fail(self, message: StepMessage, error: SwarmError) -> None:
        """Tell `message`'s entry that it failed here with `error`."""
        held = error.held if isinstance(error, PrefixMissingError) else None
        await self._report(message, _code(error), str(error), self.node_id, held)

    def forget(self, session: SessionId) -> None:
        self.ledger.forget(session)

    async def _report(
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


def _code(error: SwarmError) -> ErrorCode:
    for kind, code in _ERROR_CODES:
        if isinstance(error, kind):
            return code
    return ErrorCode.INTERNAL
