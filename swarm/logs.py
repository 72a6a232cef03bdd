"""Logging for an admin: one line per event worth knowing, as text or as JSON lines.

A node logs at INFO what an admin of a home lab needs (it joined, members come and go, its span
moved, a request was re-routed, a peer was refused); DEBUG adds the chatter. Anything a stranger
on the network can trigger goes through a `Throttle`, so nobody can flood the log.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

LogFormat = Literal["text", "json"]
LOG_LEVELS = ("debug", "info", "warning", "error")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message, and the
    traceback where there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str = "info", fmt: LogFormat = "text") -> None:
    """Send logs to stderr at `level` in `fmt`; replaces whatever was configured before."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


class Throttle:
    """Lets one event per key through per `interval_s` and counts the rest, so that whatever a
    peer or a stranger can repeat is logged at most once per interval."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def allow(self, key: str) -> int | None:
        """None to stay quiet; otherwise how many events of `key` were held back since the
        last one let through."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        if len(self._last) > 4096:  # a bounded memory of keys, whoever makes them up
            self._last.clear()
            self._held.clear()
        self._last[key] = now
        return self._held.pop(key, 0)


_PEERS_KEPT = 64  # (peer, reason) pairs a Refusals remembers, least recently refused dropped


@dataclass(frozen=True)
class PeerRefused:
    """Refusals of one reason from one peer address since the node started."""

    peer: str  # the address the refused bytes came from (an IP: nothing in them is trusted)
    reason: str
    what: str  # what was refused: "a link", "gossip", "a request"
    count: int
    last: float  # monotonic time of the last one


class Refusals:
    """What this node refused and why: counted by reason (for /metrics and /status) and by
    peer address and reason (the last `_PEERS_KEPT` pairs, for /status: who is refused and
    why), and logged at most once per peer address per `interval_s`, since a stranger can
    repeat it."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._what = what  # "a link", "gossip", "a connection": what was refused
        self._clock = clock
        self._throttle = Throttle(interval_s, clock)
        self.counts: dict[str, int] = {}
        self._peers: OrderedDict[tuple[str, str], PeerRefused] = OrderedDict()
        self._lock = threading.Lock()  # fast links refuse on the compute thread

    def refuse(self, reason: str, peer: str, detail: str) -> None:
        """Count one refusal of `reason` (a short snake_case name) from `peer`."""
        self.counts[reason] = self.counts.get(reason, 0) + 1
        with self._lock:
            before = self._peers.pop((peer, reason), None)
            count = 1 if before is None else before.count + 1
            self._peers[peer, reason] = PeerRefused(peer, reason, self._what, count, self._clock())
            if len(self._peers) > _PEERS_KEPT:
                self._peers.popitem(last=False)
        held = self._throttle.allow(peer)
        if held is not None:
            more = f" ({held} more refusals since the last line)" if held else ""
            self._log.warning("refused %s from %s: %s%s", self._what, peer, detail, more)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def by_peer(self) -> tuple[PeerRefused, ...]:
        """The peers refused, most recently refused first."""
        with self._lock:
            return tuple(reversed(self._peers.values()))


def merge_counts(*counts: dict[str, int]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for c in counts:
        for reason, n in c.items():
            merged[reason] = merged.get(reason, 0) + n
    return dict(sorted(merged.items()))
