"""Whether a frame's body is worth trying to compress, from how the last tries of its kind went.

A decode step's hidden states are dense floats: lz4 shrinks them by 0-4% (the embedded model's
activations after 10 layers: 0.996x, its token embeddings up to 1.04x), yet trying costs the
sender 15-20 us of a hop's cold Python and a kept result costs the receiver a decompression.
Gossip and error frames (text in maps) shrink well. So each message type keeps its own odds:
after a run of tries that did not pay, its frames go uncompressed and every RETRY_EVERY-th
tries again, so a kind whose bodies start to compress (a sparse activation, a new codec) is
found within that many frames."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

MISSES_BEFORE_SKIPPING = 8  # tries in a row that did not pay before a kind stops trying
RETRY_EVERY = 64  # frames of a skipping kind between tries
PAYING_SHARE = 16  # a compressed body is kept when it saves at least 1/16 of the raw bytes


def pays(raw_bytes: int, packed_bytes: int) -> bool:
    """Whether a body packed to `packed_bytes` is worth its decompression at the receiver."""
    return packed_bytes <= raw_bytes - raw_bytes // PAYING_SHARE


def should_try(misses_in_a_row: int, frames_since_try: int) -> bool:
    """Whether the next frame of a kind tries lz4: while its tries pay, or once a skipping
    kind has gone RETRY_EVERY frames without one."""
    return misses_in_a_row < MISSES_BEFORE_SKIPPING or frames_since_try >= RETRY_EVERY


@dataclass
class _Kind:
    misses: int = 0  # tries in a row that did not pay
    since_try: int = 0  # frames since the last try


@dataclass
class Lz4Odds:
    """One codec's odds per message type. Frames of a type are sealed on the event loop and
    on the compute thread: the counts take a lock (they only steer a heuristic either way)."""

    _kinds: dict[int, _Kind] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def try_next(self, message_type: int) -> bool:
        """Whether this frame of `message_type` tries lz4; call `tried` after it did."""
        with self._lock:
            kind = self._kinds.setdefault(message_type, _Kind())
            if should_try(kind.misses, kind.since_try):
                kind.since_try = 0
                return True
            kind.since_try += 1
            return False

    def tried(self, message_type: int, paid: bool) -> None:
        with self._lock:
            kind = self._kinds.setdefault(message_type, _Kind())
            kind.misses = 0 if paid else kind.misses + 1
