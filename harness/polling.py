"""Waiting, in tests and benchmarks, for what nothing signals: the one `until`. It polls a
condition with a deadline and, when the deadline passes, says what did not happen."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")


class DidNotHappen(TimeoutError):
    """What `until` waited for did not happen in time. A TimeoutError of its own type, so a
    caller that carries on without it catches this one and no other timeout."""


@overload
async def until(
    condition: Callable[[], Awaitable[T]],
    what: str | Callable[[], str],
    timeout_s: float,
    *,
    every_s: float = ...,
    ignoring: tuple[type[Exception], ...] = ...,
) -> T: ...


@overload
async def until(
    condition: Callable[[], T],
    what: str | Callable[[], str],
    timeout_s: float,
    *,
    every_s: float = ...,
    ignoring: tuple[type[Exception], ...] = ...,
) -> T: ...


async def until(
    condition: Callable[[], object],
    what: str | Callable[[], str],
    timeout_s: float,
    *,
    every_s: float = 0.1,
    ignoring: tuple[type[Exception], ...] = (),
) -> object:
    """The first truthy value of `condition()` (awaited when it returns an awaitable), asked
    every `every_s` seconds. Once `timeout_s` has passed with none, DidNotHappen: "`what`
    did not happen within `timeout_s` s". `what` may be a function, called then, so the message
    can name the state last seen. An exception of an `ignoring` type counts as "not yet" (a
    node still starting) and the last one is named; any other propagates. A condition that
    takes a while is never cut short: the deadline is checked between tries."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        try:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
        except ignoring as e:
            value, last = None, f" (last: {e!r})"
        if value:
            return value
        if time.monotonic() > deadline:
            named = what() if callable(what) else what
            raise DidNotHappen(f"{named} did not happen within {timeout_s:g} s{last}")
        await asyncio.sleep(every_s)
