"""The rule that picks which waiting prefill chunks a hop runs together, as a table."""

from __future__ import annotations

import pytest

from swarm.inference.prefill_order import WaitingChunk, next_batch


def _c(session: str, position: int, tokens: int = 128) -> tuple[str, int, int]:
    return (session, position, tokens)


# (waiting chunks in arrival order, max sessions, max tokens, the indices chosen, in order)
CASES = [
    pytest.param([], 8, 1024, [], id="nothing waits"),
    pytest.param([_c("a", 0)], 8, 1024, [0], id="a lone chunk runs at once"),
    pytest.param(
        [_c("a", 0), _c("a", 128), _c("b", 0), _c("b", 128)],
        8,
        1024,
        [0, 2],
        id="one chunk per session: a session's next chunk extends the cache of this one",
    ),
    pytest.param(
        [_c("a", 256), _c("b", 128), _c("c", 0)],
        8,
        1024,
        [2, 1, 0],
        id="the session least far along first",
    ),
    pytest.param(
        [_c("a", 0), _c("b", 0), _c("c", 0)],
        8,
        1024,
        [0, 1, 2],
        id="ties in arrival order",
    ),
    pytest.param(
        [_c("r1", 128), _c("r2", 128), _c("new", 0, 40)],
        2,
        1024,
        [2, 0],
        id="a new request's prefill never waits behind the later chunks of replays",
    ),
    pytest.param(
        [_c(s, 0) for s in "abcdefghij"],
        8,
        1024,
        list(range(8)),
        id="at most max sessions",
    ),
    pytest.param(
        [_c("a", 0, 600), _c("b", 0, 600), _c("c", 0, 300)],
        8,
        1000,
        [0, 2],
        id="within the token budget, a shorter chunk further down still fits",
    ),
    pytest.param(
        [_c("a", 0, 2000), _c("b", 0)],
        8,
        1000,
        [0],
        id="the first always runs, even past the budget",
    ),
    pytest.param(
        [_c("a", 128), _c("b", 0), _c("a", 0)],
        8,
        1024,
        [1, 0],
        id="a session's earliest-arrived chunk is its candidate, whatever its position",
    ),
]


@pytest.mark.parametrize(("chunks", "max_sessions", "max_tokens", "chosen"), CASES)
def test_next_batch(
    chunks: list[tuple[str, int, int]], max_sessions: int, max_tokens: int, chosen: list[int]
) -> None:
    waiting = [WaitingChunk(s, p, t, i) for i, (s, p, t) in enumerate(chunks)]
    assert next_batch(waiting, max_sessions, max_tokens) == chosen


def test_lockstep_replays_end_in_the_same_call() -> None:
    """Eight replays of three chunks each, all waiting: taken batch by batch, every session's
    last chunk runs in the last call, none earlier (the replays resume together)."""
    waiting = [WaitingChunk(f"s{i}", 128 * k, 128, 3 * i + k) for i in range(8) for k in range(3)]
    calls = []
    while waiting:
        chosen = next_batch(waiting, 8, 1024)
        calls.append(sorted((waiting[i].session, waiting[i].position) for i in chosen))
        waiting = [c for i, c in enumerate(waiting) if i not in set(chosen)]
    assert len(calls) == 3
    assert calls[-1] == sorted((f"s{i}", 256) for i in range(8))
