"""What was made from an object, kept per object (by identity, the object kept alive with it)
and bounded: a session's steps carry the same route and entry objects step after step, so
their packed bytes or onward routes are made once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class IdentityMemo(Generic[K, V]):
    def __init__(self, kept: int) -> None:
        self._most = kept
        self._kept: dict[int, tuple[K, V]] = {}

    def get(self, key: K, make: Callable[[K], V]) -> V:
        """`make(key)`, made once per object while kept (all forgotten when full)."""
        kept = self._kept.get(id(key))
        if kept is not None and kept[0] is key:
            return kept[1]
        value = make(key)
        if len(self._kept) >= self._most:
            self._kept.clear()
        self._kept[id(key)] = (key, value)
        return value
