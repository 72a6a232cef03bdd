"""Typed reads from a decoded msgpack map. Messages read their fields through this, so a wrong
type, a missing required field or an out-of-range value is a FrameError, never a KeyError or
TypeError; fields a message does not ask for are ignored, so newer peers may add them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from swarm.errors import FrameError

_MISSING: Any = object()
I64_MAX = 2**63 - 1


class Fields:
    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, Mapping):
            raise FrameError(f"{where} must be a map, not {type(data).__name__}")
        self._data: Mapping[Any, Any] = data
        self._where = where

    def _get(self, key: str, default: Any) -> Any:
        value = self._data.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise FrameError(f"{self._where} has no {key!r}")
            return default
        return value

    def _wrong(self, key: str, value: Any, expected: str) -> FrameError:
        return FrameError(f"{self._where}.{key} must be {expected}, not {type(value).__name__}")

    # Each getter tries the common case first: decoding a step reads a few dozen fields.

    def get_int(self, key: str, default: Any = _MISSING, *, lo: int = 0, hi: int = I64_MAX) -> int:
        value = self._data.get(key)
        if type(value) is int and lo <= value <= hi:
            return value
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._wrong(key, value, "an integer")
        if not lo <= value <= hi:
            raise FrameError(f"{self._where}.{key} = {value} is outside [{lo}, {hi}]")
        return value

    def get_float(self, key: str, default: Any = _MISSING, *, lo: float = 0.0) -> float:
        value = self._data.get(key)
        if type(value) is float and lo <= value < math.inf:
            return value
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._wrong(key, value, "a number")
        if not math.isfinite(value) or value < lo:
            raise FrameError(f"{self._where}.{key} = {value} is not a finite number >= {lo}")
        return float(value)

    def get_str(self, key: str, default: Any = _MISSING, *, allow_empty: bool = False) -> str:
        value = self._data.get(key)
        if type(value) is str and value:
            return value
        value = self._get(key, default)
        if not isinstance(value, str):
            raise self._wrong(key, value, "a string")
        if not value and not allow_empty:
            raise FrameError(f"{self._where}.{key} must not be empty")
        return value

    def get_optional_str(self, key: str) -> str | None:
        value = self._get(key, None)
        return None if value is None else self.get_str(key)

    def get_list(self, key: str, default: Any = _MISSING) -> list[Any]:
        value = self._get(key, default)
        if not isinstance(value, (list, tuple)):
            raise self._wrong(key, value, "an array")
        return list(value)

    def has(self, key: str) -> bool:
        return self._data.get(key) is not None

    def get_bool(self, key: str, default: Any = _MISSING) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self._wrong(key, value, "true or false")
        return value

    def get_fields(self, key: str) -> Fields:
        return Fields(self._get(key, _MISSING), f"{self._where}.{key}")

    def items(self, key: str, default: Any = _MISSING) -> list[Fields]:
        """An array of maps."""
        return [
            Fields(item, f"{self._where}.{key}[{i}]")
            for i, item in enumerate(self.get_list(key, default))
        ]
