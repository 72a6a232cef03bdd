"""The hop core's contract, whichever thread runs a step: what a step becomes after this
hop's layers and where it goes, its timing from the times it is given, the send it records
for the session's next step, and one pace sample per call."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from swarm.config import NetConfig
from swarm.inference.batching import StepRun
from swarm.inference.hop_core import HopCore
from swarm.inference.hop_ledger import Arrival, HopLedger
from swarm.net.links import Links
from swarm.runtime.execution.serving import Serving
from swarm.telemetry import SpeedMeter, StepCost
from swarm.types import LayerSpan, NodeId, SessionId
from swarm.wire import FrameCodec, Hop, Peer, ResultMessage, StepMessage, SwarmKeys

ME = NodeId("me")
ENTRY = Peer(NodeId("entry"), "entry:1")
HERE = Hop(ME, "me:1", LayerSpan(0, 4))
NEXT = Hop(NodeId("next"), "next:1", LayerSpan(4, 8))
WIDTH = 8


@dataclasses.dataclass
class _Paces(SpeedMeter):
    """The speed meter, with the samples it was given."""

    decodes: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    prefills: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    def record_decode(self, layers: int, rows: int, elapsed_ms: float) -> None:
        self.decodes.append((layers, rows))

    def record_prefill(self, layers: int, tokens: int, elapsed_ms: float) -> None:
        self.prefills.append((layers, tokens))


def _core() -> tuple[HopCore, _Paces]:
    speed = _Paces(1.0, StepCost(0.0, 1.0, 0.0))
    links = Links(FrameCodec(SwarmKeys.loopback().frame, ME), NetConfig())
    return HopCore(ME, Serving(), links, HopLedger(ME, speed)), speed


def _step(rows: int, route: tuple[Hop, ...], **flags: bool) -> StepMessage:
    hidden = torch.randn(1, rows, WIDTH)
    return StepMessage(SessionId("s"), 1, 5, hidden, route, ENTRY, **flags)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rows", "route", "flags", "kind", "address", "rows_on"),
    [
        (1, (HERE, NEXT), {}, StepMessage, "next:1", 1),  # on to the rest of its route
        (4, (HERE, NEXT), {}, StepMessage, "next:1", 4),  # a prefill chunk goes on whole
        (1, (HERE,), {}, ResultMessage, "entry:1", 1),  # the last hop answers the entry
        (4, (HERE,), {}, ResultMessage, "entry:1", 1),  # with the last position
        (3, (HERE,), {"verify": True}, ResultMessage, "entry:1", 3),  # every verify row
        (4, (HERE,), {"every_row": True}, ResultMessage, "entry:1", 4),  # as asked
    ],
)
def test_a_step_departs_as_the_rest_of_its_route_or_as_its_result_for_the_entry(
    rows: int,
    route: tuple[Hop, ...],
    flags: dict[str, bool],
    kind: type,
    address: str,
    rows_on: int,
) -> None:
    core, _ = _core()
    message = _step(rows, route, **flags)
    hidden = torch.randn(1, rows, WIDTH)
    run = StepRun(hidden, started=12.0, finished=15.0)
    departure = core.depart(message, Arrival(0.5, 10.0, 11.0), 11.5, run, 15.25)
    out = departure.out
    assert isinstance(out, kind) and departure.address == address
    assert out.hidden.shape[1] == rows_on
    assert torch.equal(out.hidden, hidden[:, -rows_on:])
    if isinstance(out, StepMessage):
        assert out.route == route[1:]
    (timing,) = out.timings
    assert timing.node == ME
    assert timing.wire == 0.5
    assert (timing.dispatch, timing.queue, timing.compute, timing.resume) == pytest.approx(
        (1000.0, 500.0, 3000.0, 250.0)
    )


def test_a_sessions_next_step_carries_what_sending_the_one_before_took() -> None:
    core, _ = _core()
    first, second = _step(1, (HERE, NEXT)), dataclasses.replace(_step(1, (HERE, NEXT)), step=2)
    run = StepRun(torch.zeros(1, 1, WIDTH), started=0.0, finished=0.0)
    arrival = Arrival(0.0, 0.0, 0.0)
    departure = core.depart(first, arrival, 0.0, run, 0.0)
    assert departure.out.timings[0].send == 0.0  # nothing sent before it
    core.sent(dataclasses.replace(departure, sending=departure.sending - 0.002))
    after = core.depart(second, arrival, 0.0, run, 0.0)
    assert after.out.timings[0].send >= 2.0
    # the ledger gives each send once
    assert core.depart(second, arrival, 0.0, run, 0.0).out.timings[0].send == 0.0


@pytest.mark.parametrize(
    ("rows", "flags", "run_flags", "decodes", "prefills"),
    [
        (1, {}, {}, [(4, 1)], []),  # a decode step's call
        (1, {}, {"tokens": 3}, [(4, 3)], []),  # a call of three decode rows
        (1, {}, {"first": False}, [], []),  # the call's other steps give none
        (3, {"verify": True}, {"paced": False}, [], []),  # rows run one after the other
        (4, {}, {}, [], [(4, 4)]),  # a prefill chunk
    ],
)
def test_each_call_gives_one_pace_sample(
    rows: int,
    flags: dict[str, bool],
    run_flags: dict[str, int | bool],
    decodes: list[tuple[int, int]],
    prefills: list[tuple[int, int]],
) -> None:
    core, speed = _core()
    run = StepRun(torch.zeros(1, rows, WIDTH), 1.0, 2.0, **run_flags)  # type: ignore[arg-type]
    core.pace(_step(rows, (HERE,), **flags), run)
    assert (speed.decodes, speed.prefills) == (decodes, prefills)


def test_a_step_is_admitted_once_and_never_after_a_newer_one() -> None:
    core, _ = _core()
    step = _step(1, (HERE,))
    admitted = [
        core.admit(dataclasses.replace(step, step=number)) for number in (3, 3, 2, 9, 4, 10)
    ]
    assert admitted == [True, False, False, True, False, True]
