"""A step run on the event loop's path: the steps that came over a websocket, prefill
chunks, and decode steps that wait on the hop's batcher. What happens to the step before and
after this node's layers is the hop core's (`hop_core.py`), the same for the compute thread's
path."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from swarm.errors import SpanError, SwarmError
from swarm.inference.batching import (
    DecodeBatcher,
    PrefillBatcher,
    StepRun,
    start_from_kept_blocks,
)
from swarm.inference.hop_core import HopCore
from swarm.inference.hop_ledger import Arrival, decodes
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.serving import Serving
from swarm.types import SessionId
from swarm.wire import CloseSession, StepMessage

log = logging.getLogger(__name__)


@dataclass
class HopServer:
    core: HopCore  # what a step is run through on either thread: admitted, timed, sent on
    compute: ComputeThread
    batcher: DecodeBatcher | None  # None: every step runs alone
    prefill: PrefillBatcher | None = None  # None: every prefill chunk runs alone

    async def step(self, message: StepMessage, wire_ms: float, decoded_at: float) -> None:
        """`wire_ms`: what authenticating and decoding the incoming frame took; `decoded_at`:
        perf_counter when that ended."""
        arrival = Arrival(wire_ms, decoded_at, time.perf_counter())
        core = self.core
        if not core.admit(message):
            log.info("dropping stale step %d of %s", message.step, message.session)
            return
        try:
            hop = message.route[0]
            if hop.node_id != core.node_id:
                raise SpanError(f"step addressed to {hop.node_id}, this is {core.node_id}")
            queued = time.perf_counter()
            # a verify step's rows are one session's consecutive positions, each computed as
            # its own decode step, not a prefill chunk: it joins the decode steps' batch
            if decodes(message) and self.batcher is not None:
                run = await self.batcher.run(message)
            elif not decodes(message) and self.prefill is not None:
                run = await self.prefill.run(message)
            else:
                run = await self.compute.run(_timed_forward, core.serving, message)
        except SwarmError as e:
            await core.fail(message, e)
            return
        departure = core.depart(message, arrival, queued, run, time.perf_counter())
        await core.send(departure)
        core.sent(departure)
        core.pace(message, run)
        if message.block:  # after the step went on: keeping it delays no hop
            await self.compute.run(_keep_block, core.serving, message)

    async def close(self, message: CloseSession) -> None:
        self.core.forget(SessionId(message.session))
        await self.compute.run(_close_everywhere, self.core.serving, message.session)


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
