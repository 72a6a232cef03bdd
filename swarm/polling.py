"""Waiting for a condition that nothing signals: poll it, with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

POLL_S = 0.1  # seconds between checks


async def until(condition: Callable[[], bool], timeout_s: float | None) -> bool:
    """True once `condition` holds; False when `timeout_s` (None: no limit) passes first."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not condition():
        if deadline is not None and time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True
