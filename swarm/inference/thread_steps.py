"""Decode and verify steps run where their frames arrive: on the compute thread, which reads
this node's fast links (`swarm/net/fast_links.py`) between jobs. A decode or verify step for
this node's layers runs there and its frame goes on to the next hop from there, without the
event loop: one thread wake-up per hop instead of three. The frames that one round of reads
brought run as one batched call, at most one step per session, a verify step's positions as
rows beside the decode steps', so concurrent streams batch as the hop side's `DecodeBatcher`
batches them (the same `Shard.decode_rows`, so the same bits).

Everything else that arrives on a fast link goes to the inbox, as if its websocket had
brought it: prefill chunks (their batcher chooses their order), results and errors for this
node's entry, steps for layers this node does not serve now, and every step while the node
leaves (the leaving gate answers those). What happens to a step before and after the layers
is the hop core's (`hop_core.py`), as on the event loop's path: a step that fails here, or
whose frame cannot go on over a fast link, is handed to the event loop, where the core
reports or sends it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from swarm.errors import SwarmError
from swarm.inference.ahead import StepsAhead
from swarm.inference.batching import decode_steps, one_per_session
from swarm.inference.head import Sampled
from swarm.inference.hop_core import HopCore
from swarm.inference.hop_ledger import Arrival
from swarm.inference.leaving import LeavingGate
from swarm.net.endpoint import Inbox
from swarm.net.links import Links
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.turns import SETTLE_ROUNDS
from swarm.types import SessionId
from swarm.wire import Received, ResultMessage, StepMessage

log = logging.getLogger(__name__)


class ResultHeads(Protocol):
    """The entry's head, where it runs on the compute thread as results arrive (head.py)."""

    def claims(self, result: ResultMessage) -> bool: ...

    def run_claimed(
        self, results: Sequence[ResultMessage]
    ) -> list[tuple[ResultMessage, Sampled]]: ...


def own_step_rounds(streams: int | None) -> int:
    """How many turns of the event loop the entry's own step waits before it goes to the
    compute thread: none when this entry generates one request (no other session's step can
    join its batch), else `SETTLE_ROUNDS`; an unknown count is taken as several."""
    return 0 if streams is not None and streams <= 1 else SETTLE_ROUNDS


@dataclass(frozen=True)
class OwnEntry:
    """This node's entry, as the compute thread serves it: its head runs where its results
    arrive, and its next plain steps leave from there."""

    heads: ResultHeads
    streams: Callable[[], int]  # how many requests it generates now
    ahead: StepsAhead  # where its pipeline plans each session's next step


@dataclass(frozen=True)
class _Arrived:
    message: StepMessage
    wire_ms: float  # authenticating and decoding its frame
    decoded_at: float  # perf_counter


@dataclass
class ThreadSteps:
    core: HopCore  # what a step is run through on either thread: admitted, timed, sent on
    gate: LeavingGate
    inbox: Inbox
    links: Links  # sends with `send_now` (fast links) from this thread
    loop: asyncio.AbstractEventLoop
    compute: ComputeThread  # the thread this runs on, for the entry's own steps
    entry: OwnEntry
    max_batch: int
    _waiting: list[_Arrived] = field(default_factory=list)
    _handed: set[concurrent.futures.Future[None]] = field(default_factory=set)
    # this node's own entry's steps for its own layers, each with when it was posted
    _own: deque[tuple[StepMessage, float]] = field(default_factory=deque)
    _results: list[tuple[Received, float, float]] = field(default_factory=list)
    steps: int = 0  # decode and verify steps run here so far
    batches: int = 0  # the calls they ran in

    def take(self, received: Received, wire_ms: float, decoded_at: float) -> None:
        """A frame from a fast link (on the compute thread): a decode or verify step this node
        runs now waits for the round's batch; anything else goes to the inbox."""
        message = received.message
        if isinstance(message, StepMessage) and self._runs_here(message):
            self._waiting.append(_Arrived(message, wire_ms, decoded_at))
        elif isinstance(message, ResultMessage) and self.entry.heads.claims(message):
            self._results.append((received, wire_ms, decoded_at))
        else:
            self.inbox.offer_threadsafe(received, wire_ms, decoded_at)

    def offer_own(self, message: StepMessage) -> bool:
        """A step this node's own entry sends to its first hop, itself (on the event loop):
        when it would run here, it goes to the compute thread as a fast link's frame would,
        and its frame goes on from there; False: the caller delivers it to the inbox. Steps
        that come in the same turn of the event loop (sessions whose results came together)
        or while the thread is busy queue and run as one batch. A lone request's step has no
        one to wait for: it goes at once (the wait was 0.11 ms of its every token)."""
        return self._offer_own(message, time.perf_counter(), own_step_rounds(self.entry.streams()))

    def _offer_own(self, message: StepMessage, at: float, rounds: int) -> bool:
        """Queue one of the entry's own steps (posted at `at`, perf_counter) where it runs
        here; a job runs the queue after `rounds` more turns of the event loop (0: at once,
        from any thread), unless a posted job has yet to take it."""
        if not self._runs_here(message):
            return False
        self._own.append((message, at))
        if len(self._own) == 1:
            self._post_own(rounds)
        return True

    def _post_own(self, rounds: int) -> None:
        """Post the queue to the compute thread after `rounds` more turns of the event loop:
        the sessions whose results came back with this one's send their steps meanwhile (a
        result travels a few callbacks, the stream's chunk among them, before it becomes the
        next step), so they run as one batch, as `Turns` waits before it gives the thread."""
        if rounds:
            self.loop.call_soon(self._post_own, rounds - 1)
        else:
            self.compute.post(self._run_own)

    def _run_own(self) -> None:
        """On the compute thread: the entry's own steps queued so far, run with whatever the
        last round of reads brought."""
        while self._own:
            message, posted_at = self._own.popleft()
            self.take(Received(self.core.node_id, 0, message), 0.0, posted_at)
        self.flush()

    def _runs_here(self, message: StepMessage) -> bool:
        hop = message.route[0]
        return (
            (message.hidden.shape[1] == 1 or message.verify)
            and not message.prefix  # the hop server starts the session from kept blocks
            and hop.node_id == self.core.node_id
            and not (self.gate.draining or self.gate.gone)
            and self.core.serving.shard_for(SessionId(message.session), hop.span) is not None
        )

    def flush(self) -> None:
        """After a round of reads (on the compute thread): run what it brought."""
        while self._waiting:
            batch, self._waiting = one_per_session(
                self._waiting, lambda a: a.message.session, self.max_batch
            )
            self._run([a for a in batch if self.core.admit(a.message)])
        if self._results:
            results, self._results = self._results, []
            messages = [cast(ResultMessage, r.message) for r, _, _ in results]
            queued_here: set[str] = set()  # sessions whose next step waits for this thread
            going_on = self.entry.heads.run_claimed(messages)
            # before the loop hears of the results: it then finds these steps sent
            for result, sampled in going_on:
                if self._send_ahead(result, sampled):
                    queued_here.add(result.session)
            sampled_at = time.perf_counter()  # the loop's resuming is timed from here
            now: list[tuple[Received, float, float]] = []
            later: list[tuple[Received, float, float]] = []
            for arrived, message in zip(results, messages, strict=True):
                (later if message.session in queued_here else now).append(arrived)
            if now:
                self._offer(now, sampled_at)
            if later:
                # their next steps run this node's own layers first, then the loop hears of
                # these results. Woken before, the loop took the GIL each time this thread
                # let it go ahead of those layers (a job's wake-up, a look at the sockets),
                # for its ~0.3 ms of Python streaming a token: 0.26 -> 0.08 ms of a token
                # between the head and the layers. The client sees the token that much
                # later; no step waits. The others' results go to the loop at once: their
                # next steps are the loop's to send.
                self.compute.post(functools.partial(self._offer, later, sampled_at))

    def _offer(self, results: list[tuple[Received, float, float]], sampled_at: float) -> None:
        for received, wire_ms, _ in results:  # the step's waiter takes it there
            self.inbox.offer_threadsafe(received, wire_ms, sampled_at)

    def _send_ahead(self, result: ResultMessage, sampled: Sampled) -> bool:
        """The session's next step, where the pipeline planned one: to this node's own layers
        as a job after those queued (the thread keeps taking other work between a stream's
        tokens), or over the first hop's fast link. Whether it waits in this node's queue."""
        ahead = self.entry.ahead
        position = result.position + result.hidden.shape[1]
        leaving = ahead.next_step(result.session, position, sampled.next_input)
        if leaving is None:
            return False
        message, sending = leaving.message, time.perf_counter()
        first = message.route[0]
        here = first.node_id == self.core.node_id
        if here:
            ok = self._offer_own(message, sending, 0)
        else:
            ok = self.links.send_now(first.address, message, wait=True)
        ahead.sent(leaving, ok, sending, (time.perf_counter() - sending) * 1000)
        return here and ok

    def _run(self, batch: list[_Arrived]) -> None:
        if not batch:
            return
        taken = time.perf_counter()
        core = self.core
        runs = decode_steps(core.serving, [a.message for a in batch])
        self.steps += len(batch)
        self.batches += 1
        for arrived, run in zip(batch, runs, strict=True):
            message = arrived.message
            if isinstance(run, SwarmError):
                self._on_loop(core.fail(message, run))
                continue
            arrival = Arrival(arrived.wire_ms, arrived.decoded_at, taken)
            departure = core.depart(message, arrival, taken, run, run.finished)
            out = departure.out
            if isinstance(out, ResultMessage) and message.entry.node_id == core.node_id:
                # for this node's own entry: its head may run on it here
                self.take(Received(core.node_id, 0, out), 0.0, time.perf_counter())
            elif not core.send_now(departure):
                self._on_loop(core.send(departure))
            core.sent(departure)
        # after the frames have left: none of this is on the next hop's way
        for arrived, run in zip(batch, runs, strict=True):
            if not isinstance(run, SwarmError):
                core.pace(arrived.message, run)  # the call's first step gives its sample

    def _on_loop(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` on the event loop, kept until done; its failure is logged there."""
        try:
            future = asyncio.run_coroutine_threadsafe(work, self.loop)
        except RuntimeError:  # the loop has closed: the node is stopping
            work.close()
            return
        self._handed.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: concurrent.futures.Future[None]) -> None:
        self._handed.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.error("a step handed to the event loop failed", exc_info=future.exception())
