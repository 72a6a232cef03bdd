"""A generation's growing token list as final text: what the stream may release after each
token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: Sequence[int]) -> str: ...


class TextStream:
    """Turns the growing token list into text deltas: holds back an incomplete UTF-8 character
    and any tail that could still become a stop string.

    Each token costs the same however long the output grows: only a window of the newest
    tokens is decoded (from the start of the last cleanly decoded token on, so a tokenizer's
    handling of a word's first piece is the same in both decodes whose difference is taken),
    and stop strings are looked for only in the text not yet released, which a possible stop
    string's prefix and the newest token's text bound."""

    def __init__(self, decoder: Decoder, stop: Sequence[str]) -> None:
        self._decoder = decoder
        self._stop = tuple(stop)
        self._ids: Sequence[int] = ()
        self._start = 0  # tokens before this are text already, outside the window
        self._read = 0  # tokens decoded cleanly (no incomplete character at their end)
        self._taken = 0  # characters of the window's text already moved to _pending
        self._pending = ""  # text decoded but not released: it may begin a stop string
        self.hit: str | None = None  # the stop string that ended the text, once one has

    def push(self, generated: Sequence[int]) -> tuple[str, bool]:
        """Returns (new final text, whether a stop string was hit)."""
        self._ids = generated
        self._pending += self._new_text()
        hits = [(at, s) for s in self._stop if (at := self._pending.find(s)) != -1]
        if hits:
            at, self.hit = min(hits, key=lambda hit: hit[0])  # the first listed, on a tie
            return self._release(at), True
        hold = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(self._pending)), hold, -1):
                if self._pending.endswith(stop[:size]):
                    hold = size
                    break
        return self._release(len(self._pending) - hold), False

    def _new_text(self) -> str:
        window = self._decoder.decode(self._ids[self._start :])
        stable = window.rstrip("\ufffd")  # bytes of a character still to come
        new = window[self._taken : len(stable)] if len(stable) > self._taken else ""
        if len(stable) == len(window):  # decoded cleanly: slide the window up to here
            self._start, self._read = self._read, len(self._ids)
            self._taken = len(self._decoder.decode(self._ids[self._start : self._read]))
        else:
            self._taken = max(self._taken, len(stable))
        return new

    def flush(self) -> str:
        window = self._decoder.decode(self._ids[self._start :])
        return self._release(len(self._pending)) + window[self._taken :]

    def _release(self, end: int) -> str:
        out, self._pending = self._pending[:end], self._pending[end:]
        return out
