"""What this entry has answered lately: one record per generation, kept in a bounded ring for
the dashboard (through /status) and fed to the metrics."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from swarm.api.backend import Done, TextDelta
from swarm.schema import RequestRecord

KEEP_RECENT = 50  # finished requests listed in /status


@dataclass(frozen=True)
class Timing:
    """How long a generation has taken so far, from its request's tokenizing on."""

    elapsed_s: float
    first_token_s: float | None  # until its first token; None: none came yet


class Tracker:
    """Follows one generation from its first event to its end."""

    def __init__(self, request_id: str, endpoint: str, stream: bool) -> None:
        self.request_id = request_id
        self.endpoint = endpoint
        self.stream = stream
        self.started_unix = time.time()
        self._started = time.perf_counter()
        self._first: float | None = None
        self.tokens = 0
        self.done: Done | None = None
        self.outcome: str | None = None  # set when it ends otherwise than by finishing

    def saw(self, event: TextDelta | Done) -> None:
        if isinstance(event, TextDelta):
            self.tokens += 1
            if self._first is None:
                self._first = time.perf_counter()
        else:
            self.done = event

    def timing(self) -> Timing:
        first = None if self._first is None else self._first - self._started
        return Timing(time.perf_counter() - self._started, first)

    def record(self, prompt_tokens: int) -> RequestRecord:
        done = self.done
        trace = done.trace if done is not None else None
        timing = self.timing()
        return RequestRecord(
            id=self.request_id,
            endpoint=self.endpoint,
            stream=self.stream,
            outcome=self.outcome or (done.finish_reason if done is not None else "error"),
            started_unix=self.started_unix,
            duration_ms=timing.elapsed_s * 1000,
            first_token_ms=None if timing.first_token_s is None else timing.first_token_s * 1000,
            prompt_tokens=prompt_tokens,
            completion_tokens=done.completion_tokens if done is not None else self.tokens,
            route=() if trace is None else trace.route,
            hop_timings_ms=() if trace is None else trace.hop_timings_ms,
            cached_tokens=done.cached_tokens if done is not None else 0,
        )


class RecentRequests:
    def __init__(self, keep: int = KEEP_RECENT) -> None:
        self._ring: deque[RequestRecord] = deque(maxlen=keep)

    def add(self, record: RequestRecord) -> None:
        self._ring.append(record)

    def snapshot(self) -> tuple[RequestRecord, ...]:
        """Newest first."""
        return tuple(reversed(self._ring))
