"""Where a session's decode steps spend their time: the entry's own stamps and each hop's
`HopTimes`, summed over the steps (`bench.swarm --timeline` prints them). Prefill chunks and
replays are left out: they are few, long, and would hide what a token costs."""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm.schema import HopTimeline, HopTimes, Timeline

_PARTS = ("wire_in", "dispatch", "queue", "compute", "resume", "send")


def _parts(t: HopTimes) -> tuple[float, ...]:
    return (t.wire, t.dispatch, t.queue, t.compute, t.resume, t.send)


@dataclass
class TimelineSums:
    steps: int = 0
    step_ms: float = 0.0
    send_ms: float = 0.0
    resume_ms: float = 0.0
    head_ms: float = 0.0
    _hops: dict[str, tuple[int, list[float]]] = field(default_factory=dict)

    def add_step(
        self, hops: tuple[HopTimes, ...], step_ms: float, send_ms: float, resume_ms: float
    ) -> None:
        """One decode step: what the entry measured around it, and what each hop reported."""
        self.steps += 1
        self.step_ms += step_ms
        self.send_ms += send_ms
        self.resume_ms += resume_ms
        for timing in hops:
            steps, sums = self._hops.get(timing.node, (0, [0.0] * len(_PARTS)))
            self._hops[timing.node] = (
                steps + 1,
                [a + b for a, b in zip(sums, _parts(timing), strict=True)],
            )

    def add_head(self, ms: float, within_step: bool = False) -> None:
        """The head, sampling and the next embedding: the generation's wait for them, or
        (`within_step`) what they took on the compute thread as the step's result arrived,
        before the step ended; then the step's time is counted without them."""
        self.head_ms += ms
        if within_step:
            self.step_ms -= ms

    def report(self) -> Timeline | None:
        if not self.steps:
            return None
        hops = tuple(HopTimeline(node, steps, *sums) for node, (steps, sums) in self._hops.items())
        return Timeline(self.steps, self.step_ms, self.send_ms, self.resume_ms, self.head_ms, hops)
