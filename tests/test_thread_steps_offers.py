"""When the compute thread tells the event loop of results it sampled: a session whose next
step runs this node's own layers first hears of its token once that step has run; every
other session at once (its next step is the loop's to send)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import torch

from swarm.inference.ahead import Leaving, StepsAhead
from swarm.inference.head import Sampled
from swarm.inference.hop_core import HopCore
from swarm.inference.leaving import LeavingGate
from swarm.inference.thread_steps import OwnEntry, ThreadSteps
from swarm.net.endpoint import Inbox
from swarm.net.links import Links
from swarm.runtime.execution.compute import ComputeThread
from swarm.types import LayerSpan, NodeId, SessionId
from swarm.wire import Hop, Peer, Received, ResultMessage, StepMessage

ME = NodeId("me")
ELSEWHERE = NodeId("other")


@dataclass
class _Heads:
    def claims(self, result: ResultMessage) -> bool:
        return True

    def run_claimed(self, results: Sequence[ResultMessage]) -> list[tuple[ResultMessage, Sampled]]:
        return [(r, Sampled(1, torch.zeros(1, 1, 4), None, 0.1)) for r in results]


@dataclass
class _Ahead:
    """Next steps planned for some sessions: to this node's layers or another's."""

    first_hops: dict[str, NodeId]
    sent_ok: list[str] = field(default_factory=list)

    def next_step(self, session: str, position: int, hidden: torch.Tensor) -> Leaving | None:
        first = self.first_hops.get(session)
        if first is None:
            return None
        route = (Hop(first, f"{first}:1", LayerSpan(0, 4)),)
        step = StepMessage(SessionId(session), 2, position, hidden, route, Peer(ME, "me:1"))
        return Leaving(step, cast(asyncio.Future[Any], None))

    def sent(self, leaving: Leaving, ok: bool, sent_at: float, send_ms: float) -> None:
        self.sent_ok.append(leaving.message.session)


@dataclass
class _Thread:
    """The compute thread's queue: posted jobs run when the test says."""

    jobs: list[Callable[[], None]] = field(default_factory=list)

    def post(self, fn: Callable[[], None]) -> None:
        self.jobs.append(fn)


def _steps(first_hops: dict[str, NodeId], events: list[str]) -> tuple[ThreadSteps, _Thread]:
    inbox = SimpleNamespace(
        offer_threadsafe=lambda received, ms, at: events.append(
            f"loop hears {received.message.session}"
        )
    )
    core = SimpleNamespace(
        node_id=ME,
        serving=SimpleNamespace(shard_for=lambda session, span: object()),
        admit=lambda message: True,
    )
    gate = SimpleNamespace(draining=False, gone=False)
    links = SimpleNamespace(
        send_now=lambda address, message, wait: events.append("sent on") or True
    )
    thread = _Thread()
    steps = ThreadSteps(
        cast(HopCore, core),
        cast(LeavingGate, gate),
        cast(Inbox, inbox),
        cast(Links, links),
        cast(asyncio.AbstractEventLoop, None),
        cast(ComputeThread, thread),
        OwnEntry(_Heads(), lambda: 8, cast(StepsAhead, _Ahead(first_hops))),
        8,
    )
    steps._run = lambda batch: events.extend(f"run {a.message.session}" for a in batch)  # type: ignore[method-assign]
    return steps, thread


def _results(steps: ThreadSteps, sessions: list[str]) -> None:
    for session in sessions:
        result = ResultMessage(SessionId(session), 1, 7, torch.zeros(1, 1, 4))
        steps.take(Received(ELSEWHERE, 0, result), 0.0, 0.0)


def test_a_session_whose_next_step_runs_here_hears_of_its_token_after_that_step() -> None:
    events: list[str] = []
    steps, thread = _steps({"here": ME, "there": ELSEWHERE}, events)
    _results(steps, ["here", "there", "loop's"])
    steps.flush()
    # the other sessions' results go to the loop at once; "here" waits for its step's job
    assert events == ["sent on", "loop hears there", "loop hears loop's"]
    for job in list(thread.jobs):
        job()
    assert events[3:] == ["run here", "loop hears here"]


def test_with_no_step_waiting_here_every_result_goes_to_the_loop_at_once() -> None:
    events: list[str] = []
    steps, thread = _steps({"there": ELSEWHERE}, events)
    _results(steps, ["there", "loop's"])
    steps.flush()
    assert events == ["sent on", "loop hears there", "loop hears loop's"]
    assert not thread.jobs
