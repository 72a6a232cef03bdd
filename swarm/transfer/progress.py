"""What a fetch has done so far: for GET /status, /metrics and the dashboard, and a progress
bar on the terminal of the user who started the node."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

from swarm.runtime.checkpoint.manifest import CHUNK_BYTES
from swarm.schema import TransferReport


@dataclass
class Progress:
    parts_done: int = 0
    parts_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    active: bool = False
    current: str | None = None
    sources: tuple[str, ...] = ()
    _started: float = 0.0
    _ended: float = 0.0
    _fetched: int = 0  # bytes received by the running (or last) fetch
    _rate: float = 0.0  # bytes per second of the last fetch that moved a chunk or more
    _bar: Any = field(default=None, repr=False)

    def begin(self, parts: list[str], nbytes: int) -> None:
        self.parts_total += len(parts)
        self.bytes_total += nbytes
        self.active, self._started, self._fetched = True, time.monotonic(), 0
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=nbytes, unit="B", unit_scale=True, desc="fetching weights from peers"
            )

    def part(self, part: str, size: int, expected: int, sources: list[str]) -> None:
        """`size`: the part file's bytes, now known from its digest; `expected`: what
        `begin` counted for it."""
        self.current, self.sources = part, tuple(sources)
        self.bytes_total += size - expected
        if self._bar is not None:
            self._bar.total += size - expected

    def advance(self, nbytes: int) -> None:
        self.bytes_done += nbytes
        self._fetched += nbytes
        if self._bar is not None:
            self._bar.update(nbytes)

    def finished(self) -> None:
        self.parts_done += 1

    def end(self) -> None:
        self.active, self.current, self.sources = False, None, ()
        self._ended = time.monotonic()
        if self._fetched >= CHUNK_BYTES:
            self._rate = self._fetched / max(self._ended - self._started, 1e-9)
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def measured_bytes_per_s(self) -> float:
        """The rate of the last fetch that moved at least a chunk; 0 before any did."""
        return self._rate

    def report(self, bad_peers: tuple[str, ...], sent_bytes: int) -> TransferReport:
        until = time.monotonic() if self.active else self._ended
        elapsed = until - self._started
        return TransferReport(
            active=self.active,
            parts_done=self.parts_done,
            parts_total=self.parts_total,
            bytes_done=self.bytes_done,
            bytes_total=self.bytes_total,
            bytes_per_s=round(self._fetched / elapsed, 1) if elapsed > 0 else 0.0,
            current=self.current,
            sources=self.sources,
            bad_peers=bad_peers,
            sent_bytes=sent_bytes,
        )
