"""A session's next decode step, sent from the compute thread as soon as the head has sampled
the token it carries, instead of after the event loop has streamed that token.

Where the entry's head runs on the compute thread as a step's result arrives (head.py), the
token and its embedding are ready there; the event loop would then wake, stream the token,
decide to go on, and hand the next step back to the thread or to a link: 0.4-0.7 ms of every
token on a 2-core machine, with every hop idle meanwhile. When the step cannot be anything but
a plain one-position step (no drafts can follow, the token does not end the request, there is
room for another), the thread sends it at once and the loop streams the token while the hops
compute. The pipeline plans each session's next step as it sends one (its route, position and
codec); the compute thread turns the plan into a step, its waiter registered first; the
pipeline's next `forward` for that position takes the step sent and waits for its reply.

A request that then stops on a stop string (only the loop decodes text) leaves one step
computed for nothing: the session is closed on every hop, and the reply finds no waiter."""

from __future__ import annotations

import asyncio
import itertools
import threading
from dataclasses import dataclass, field

import torch

from swarm.inference.waiters import Reply, StepWaiters
from swarm.types import SessionId
from swarm.wire import Codec, Hop, Peer, StepMessage


@dataclass(frozen=True)
class NextStep:
    """What the compute thread needs to send a session's next plain decode step."""

    route: tuple[Hop, ...]
    entry: Peer
    codec: Codec
    position: int  # the next step's position: the current step's plus one


@dataclass(frozen=True)
class SentAhead:
    """A step the compute thread sent, for the pipeline's next `forward` to wait on."""

    step: int
    position: int
    reply: asyncio.Future[Reply]
    sent_at: float  # perf_counter when its sending began
    send_ms: float  # what sending it took


@dataclass(frozen=True)
class Leaving:
    """A step made on the compute thread, its waiter registered, on its way out."""

    message: StepMessage
    reply: asyncio.Future[Reply]


@dataclass
class StepsAhead:
    """Each session's planned next step and the step sent ahead for it. Plans and taking
    happen on the event loop, making and sending on the compute thread; a step is sent before
    the loop hears of the result it follows, so the loop never looks for one still leaving."""

    waiters: StepWaiters
    steps: itertools.count[int]  # the pipeline's step numbers, shared with its own sends
    loop: asyncio.AbstractEventLoop  # the pipeline's: its replies resolve there
    _plans: dict[str, NextStep] = field(default_factory=dict)
    _sent: dict[str, SentAhead] = field(default_factory=dict)
    _open: set[str] = field(default_factory=set)  # sessions planned and not cancelled since
    _lock: threading.Lock = field(default_factory=threading.Lock)
    count: int = 0  # steps sent ahead so far

    def plan(self, session: SessionId, next_step: NextStep) -> None:
        """On the loop, as a plain decode step of `session` leaves: what its successor is."""
        with self._lock:
            self._plans[session] = next_step
            self._open.add(session)

    def take(self, session: SessionId, position: int) -> SentAhead | None:
        """On the loop: the step sent ahead for `session` at `position`, if one was; one sent
        for another position is forgotten (its reply will find no waiter)."""
        with self._lock:
            self._plans.pop(session, None)
            sent = self._sent.pop(session, None)
        if sent is not None and sent.position != position:
            self.waiters.forget(session, sent.step)
            return None
        return sent

    def cancel(self, session: SessionId) -> None:
        """On the loop: the session ends, re-routes or sends a step of another kind."""
        with self._lock:
            self._plans.pop(session, None)
            self._open.discard(session)
            sent = self._sent.pop(session, None)
        if sent is not None:
            self.waiters.forget(session, sent.step)

    def next_step(self, session: str, position: int, hidden: torch.Tensor) -> Leaving | None:
        """On the compute thread, once the head sampled the token `hidden` embeds: the
        session's next step at `position`, its waiter registered, or None where none was
        planned there. Then `sent` says whether it left."""
        with self._lock:
            planned = self._plans.pop(session, None)
        if planned is None or planned.position != position:
            return None
        step = next(self.steps)
        reply = self.waiters.expect_on(self.loop, SessionId(session), step)
        message = StepMessage(
            SessionId(session),
            step,
            position,
            hidden,
            planned.route,
            planned.entry,
            (),
            planned.codec,
        )
        return Leaving(message, reply)

    def sent(self, leaving: Leaving, ok: bool, sent_at: float, send_ms: float) -> None:
        """On the compute thread: whether the step left. One that did not, or whose session
        was cancelled meanwhile, is forgotten, and the pipeline sends the step itself."""
        message = leaving.message
        with self._lock:
            kept = ok and message.session in self._open
            if kept:
                self._sent[message.session] = SentAhead(
                    message.step, message.position, leaving.reply, sent_at, send_ms
                )
                self.count += 1
        if not kept:
            self.waiters.forget(message.session, message.step)
