"""What a hop keeps of the steps it runs, whichever thread runs them: the event loop (the
hop server, for steps that came over a websocket or wait on a batcher) or the compute thread
(steps read from fast links, `thread_steps.py`). One record, so a session whose steps switch
between the two paths (a fast link that broke, a node that leaves) keeps one history."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from swarm.inference.batching import StepRun
from swarm.schema import HopTimes
from swarm.telemetry import SpeedMeter
from swarm.types import NodeId, SessionId
from swarm.wire import StepMessage

_REMEMBERED_SESSIONS = 4096  # sessions whose last step number and send time a hop keeps


@dataclass(frozen=True)
class Arrival:
    """When a step's frame reached this hop and what opening it took."""

    wire_ms: float  # authenticating and decoding its frame
    decoded_at: float  # perf_counter when that ended
    taken: float  # perf_counter when the hop took the step up


@dataclass
class HopLedger:
    node_id: NodeId
    speed: SpeedMeter  # fed one sample per call the hop runs
    # The highest step number seen per session. An entry numbers its steps in increasing
    # order, so a step at or below it is a duplicate or a straggler from a route the entry has
    # given up on (e.g. a frozen hop that woke up): running it would corrupt the session's
    # cache, which the replay on the new route has rebuilt.
    _last_step: OrderedDict[SessionId, int] = field(default_factory=OrderedDict)
    # milliseconds encoding and writing each session's last frame on, for its next timing
    _last_send_ms: dict[SessionId, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # both threads take steps

    def is_new(self, message: StepMessage) -> bool:
        """Whether `message` is the newest step of its session seen so far (then it is
        remembered)."""
        session = SessionId(message.session)
        with self._lock:
            last = self._last_step.get(session)
            if last is not None and message.step <= last:
                return False
            self._last_step[session] = message.step
            self._last_step.move_to_end(session)
            while len(self._last_step) > _REMEMBERED_SESSIONS:
                forgotten, _ = self._last_step.popitem(last=False)
                self._last_send_ms.pop(forgotten, None)
        return True

    def timing(
        self, message: StepMessage, arrival: Arrival, queued: float, run: StepRun, resumed: float
    ) -> HopTimes:
        """What the step took here, for its frame on: `queued` (perf_counter) when it began
        to wait for the compute thread, `resumed` when the sender took its output up; and
        what sending the session's previous frame took."""
        times = HopTimes(
            self.node_id,
            queue=(run.started - queued) * 1000,
            compute=(run.finished - run.started) * 1000,
            wire=arrival.wire_ms,
            dispatch=(arrival.taken - arrival.decoded_at) * 1000,
            resume=(resumed - run.finished) * 1000,
            send=self._last_send_ms.pop(SessionId(message.session), 0.0),
        )
        if decodes(message):
            # what each decode step's frame costs whatever its layers: opening it and sending
            # the last one on. Dispatch and resume are waits for the loop, and under load
            # mostly other frames' work: counted per step they were a batch's worth of it
            self.speed.record_frame(times.wire + times.send)
        return times

    def sent(self, message: StepMessage, sending: float) -> None:
        """The step's frame went on; `sending`: perf_counter when its sending began."""
        self._last_send_ms[SessionId(message.session)] = (time.perf_counter() - sending) * 1000

    def forget(self, session: SessionId) -> None:
        self._last_send_ms.pop(session, None)

    def pace(self, message: StepMessage, run: StepRun) -> None:
        """One sample per call: the wall time the call of `message`'s step took here. Under
        steady load every step is batched, and a pace taken from lone steps only never saw
        the machine slow down (a node capped mid-run kept announcing its idle pace)."""
        if not run.first:
            return
        own_ms = (run.finished - run.started) * 1000
        layers = len(message.route[0].span)
        tokens = run.tokens or message.hidden.shape[1]
        if not decodes(message):
            self.speed.record_prefill(layers, tokens, own_ms)
        elif run.paced:  # as many rows as the call ran together
            self.speed.record_decode(layers, tokens, own_ms)


def decodes(message: StepMessage) -> bool:
    """Whether `message` is a decode step (one position) or a verify step (every position as
    its own decode step would compute it), not a prefill chunk."""
    return message.verify or message.hidden.shape[1] == 1
