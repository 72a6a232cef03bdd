from __future__ import annotations

import pytest
import torch

from swarm.errors import KVCacheFullError, PositionMismatchError, SessionNotFoundError
from swarm.runtime.kv_cache import KVCacheManager, KVShape
from swarm.types import SessionId

SHAPE = KVShape(
    layers=(3, 4), kv_heads=2, head_dim=8, dtype=torch.float32, device=torch.device("cpu")
)
PER_TOKEN = SHAPE.bytes_per_token()  # 2 (k,v) * 2 layers * 2 heads * 8 dims * 4 bytes = 256


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _manager(budget_tokens: int, clock: FakeClock | None = None) -> KVCacheManager:
    return KVCacheManager(
        SHAPE, budget_tokens * PER_TOKEN, idle_timeout_s=10.0, clock=clock or FakeClock()
    )


def _step(manager: KVCacheManager, session: str, position: int, tokens: int) -> None:
    kv = manager.acquire(SessionId(session), position, tokens)
    kv.begin_step(position, tokens)
    for layer in SHAPE.layers:
        k = torch.full((1, 2, tokens, 8), float(position))
        keys, _ = kv.update(k, k, layer)
        assert keys.shape == (1, 2, position + tokens, 8)
    kv.commit()


def test_bytes_per_token() -> None:
    assert PER_TOKEN == 256


def test_capacity_grows_in_quanta_and_keeps_contents() -> None:
    m = _manager(1024)
    _step(m, "a", 0, 10)
    kv = m.get(SessionId("a"))
    assert kv.capacity == 64
    for position in range(10, 70):
        _step(m, "a", position, 1)
    assert kv.capacity == 128 and kv.length == 70
    keys, _ = kv.update(torch.zeros(1, 2, 0, 8), torch.zeros(1, 2, 0, 8), 3)
    assert keys[0, 0, 5, 0] == 0.0 and keys[0, 0, 69, 0] == 69.0
    assert m.used_bytes == 128 * PER_TOKEN


def test_least_recently_used_session_is_evicted_when_full() -> None:
    m = _manager(192)
    _step(m, "a", 0, 64)
    _step(m, "b", 0, 64)
    _step(m, "a", 64, 1)  # a grows to 128, used now, b is the oldest
    _step(m, "c", 0, 10)  # needs 64 more: 128 + 64 + 64 > 192, so b goes
    assert set(m.sessions()) == {"a", "c"}
    with pytest.raises(SessionNotFoundError):
        m.acquire(SessionId("b"), 64, 1)


def test_a_session_larger_than_the_budget_fails_cleanly() -> None:
    m = _manager(128)
    _step(m, "a", 0, 10)
    with pytest.raises(KVCacheFullError, match="cannot hold 200 positions"):
        m.acquire(SessionId("big"), 0, 200)
    assert m.sessions() == ["a"]  # nothing evicted for a request that could never fit
    assert m.used_bytes == 64 * PER_TOKEN


def test_idle_sessions_expire() -> None:
    clock = FakeClock()
    m = _manager(1024, clock)
    _step(m, "old", 0, 4)
    clock.now = 8.0
    _step(m, "new", 0, 4)
    clock.now = 12.0
    assert m.evict_idle() == ["old"]
    assert m.sessions() == ["new"]


def test_step_beyond_the_cache_is_refused() -> None:
    m = _manager(1024)
    _step(m, "a", 0, 4)
    kv = m.acquire(SessionId("a"), 4, 1)
    with pytest.raises(PositionMismatchError):
        kv.begin_step(6, 1)


def test_uncommitted_step_does_not_count() -> None:
    m = _manager(1024)
    _step(m, "a", 0, 4)
    kv = m.acquire(SessionId("a"), 4, 2)
    kv.begin_step(4, 2)
    kv.update(torch.zeros(1, 2, 2, 8), torch.zeros(1, 2, 2, 8), 3)  # fails before layer 4 runs
    assert kv.length == 4
    _step(m, "a", 4, 2)
    assert kv.length == 6
