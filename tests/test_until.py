"""The harness's one wait (`harness.polling.until`): what it returns, what it says when the
deadline passes, and which errors count as "not yet"."""

from __future__ import annotations

import pytest

from harness.polling import DidNotHappen, until


async def test_the_first_truthy_value_of_a_plain_or_an_async_condition() -> None:
    seen: list[int] = []

    def grows() -> list[int]:
        seen.append(len(seen))
        return seen if len(seen) == 3 else []

    async def answers() -> str:
        return "ready"

    assert await until(grows, "three tries", 5, every_s=0.001) == [0, 1, 2]
    assert await until(answers, "an answer", 5) == "ready"


async def test_a_deadline_that_passes_names_what_did_not_happen() -> None:
    state = {"seen": 0}

    def never() -> bool:
        state["seen"] += 1
        return False

    with pytest.raises(DidNotHappen, match=r"^the sun rising did not happen within 0.05 s$"):
        await until(never, "the sun rising", 0.05, every_s=0.01)
    seen = state["seen"]
    with pytest.raises(TimeoutError, match=r"^the sun rising \(tried \d+ times\) did not"):
        await until(never, lambda: f"the sun rising (tried {state['seen'] - seen} times)", 0.05)


async def test_ignored_errors_are_not_yet_and_the_last_is_named() -> None:
    tries = iter([ConnectionError("refused"), ConnectionError("reset"), None])

    def connects() -> bool:
        error = next(tries)
        if error is not None:
            raise error
        return True

    assert await until(connects, "a connection", 5, every_s=0.001, ignoring=(ConnectionError,))

    def refuses() -> bool:
        raise ConnectionError("refused")

    last = r"within 0.02 s \(last: ConnectionError\('refused'\)\)$"
    with pytest.raises(DidNotHappen, match=last):
        await until(refuses, "a connection", 0.02, every_s=0.01, ignoring=(ConnectionError,))
    with pytest.raises(ValueError, match="not ignored"):
        await until(lambda: int("not ignored"), "a number", 5, ignoring=(ConnectionError,))
