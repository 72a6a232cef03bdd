"""The guard's slots and wait queue under more requests than it admits, driven directly:
who waits, who gets 429 with a Retry-After, and what a client that left while it waited
costs (nothing: no room in the queue, and the slot it is handed passes on)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from harness.polling import until
from swarm.api.errors import ApiError
from swarm.api.guard import CLIENT_GONE, ApiPolicy, Guard

pytestmark = pytest.mark.timeout(30)


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def guard(slots: int, queue: int, timeout_s: float = 10.0, clock: Clock | None = None) -> Guard:
    policy = ApiPolicy(
        token=None,
        max_body_bytes=1024,
        max_concurrent_requests=slots,
        retry_after_s=2,
        queue_size=queue,
        queue_timeout_s=timeout_s,
    )
    return Guard(policy, lambda route, status: None, clock or Clock())


@dataclass
class Client:
    """One request at the guard: whether it holds a slot, how it was refused, and a switch
    for its connection."""

    left: bool = False
    holding: bool = False
    refused: ApiError | None = None
    release: asyncio.Event | None = None

    async def ask(self, at: Guard) -> None:
        self.release = asyncio.Event()
        try:
            async with at.slot(lambda: self.left):
                self.holding = True
                await self.release.wait()
                self.holding = False
        except ApiError as e:
            self.refused = e


async def test_a_full_queue_answers_429_with_a_retry_after() -> None:
    at = guard(slots=1, queue=1)
    first, second, third = Client(), Client(), Client()
    async with asyncio.TaskGroup() as group:
        group.create_task(first.ask(at))
        await until(lambda: first.holding, "the first holding the slot", 5.0, every_s=0.01)
        group.create_task(second.ask(at))
        await until(lambda: at.queued == 1, "the second queued", 5.0, every_s=0.01)
        await third.ask(at)
        assert third.refused is not None and third.refused.status == 429
        assert third.refused.retry_after_s == 2  # nothing measured yet: the configured value
        assert first.release is not None
        first.release.set()
        await until(lambda: second.holding, "the slot passing to the second", 5.0, every_s=0.01)
        assert second.release is not None
        second.release.set()
    assert second.refused is None and at.in_flight == 0


async def test_a_waiter_whose_client_left_takes_no_room_and_passes_its_slot_on() -> None:
    at = guard(slots=1, queue=1)
    first, ghost, third = Client(), Client(), Client()
    async with asyncio.TaskGroup() as group:
        group.create_task(first.ask(at))
        await until(lambda: first.holding, "the first holding the slot", 5.0, every_s=0.01)
        group.create_task(ghost.ask(at))
        await until(lambda: at.queued == 1, "the second queued", 5.0, every_s=0.01)
        ghost.left = True
        assert at.queued == 0  # the queue has room again
        group.create_task(third.ask(at))
        await until(lambda: at.queued == 1, "the third queued", 5.0, every_s=0.01)
        assert third.refused is None
        assert first.release is not None
        first.release.set()
        await until(lambda: third.holding, "the slot passing to the third", 5.0, every_s=0.01)
        assert ghost.refused is not None and ghost.refused.status == 499
        assert ghost.refused.message == CLIENT_GONE and not ghost.holding
        assert at.in_flight == 1 and at.queued == 0
        assert third.release is not None
        third.release.set()
    assert at.in_flight == 0


@pytest.mark.parametrize(
    ("slots", "timeout_s", "queued", "refused_retry_after"),
    [
        # one slot held 30 s a request: a first waiter's slot comes in ~30 s, a second's ~60 s
        (1, 60.0, 2, 90),  # two wait; the third would wait ~90 s
        (1, 10.0, 0, 30),  # none may wait: the first would wait ~30 s, past its 10
        (3, 20.0, 2, 30),  # three slots share the pace: ~10, ~20 s for the waiters, then ~30
    ],
)
async def test_a_request_that_would_wait_past_its_timeout_is_refused_at_once(
    slots: int, timeout_s: float, queued: int, refused_retry_after: int
) -> None:
    clock = Clock()
    at = guard(slots=slots, queue=8, timeout_s=timeout_s, clock=clock)
    measured = Client()
    async with asyncio.TaskGroup() as group:
        group.create_task(measured.ask(at))
        await until(lambda: measured.holding, "the first holding a slot", 5.0, every_s=0.01)
        clock.now = 30.0
        assert measured.release is not None
        measured.release.set()
    holders = [Client() for _ in range(slots)]
    waiters = [Client() for _ in range(queued)]
    late = Client()
    async with asyncio.TaskGroup() as group:
        for holder in holders:
            group.create_task(holder.ask(at))
        await until(lambda: at.in_flight == slots, "every slot taken", 5.0, every_s=0.01)
        for waiter in waiters:
            group.create_task(waiter.ask(at))
        await until(lambda: at.queued == queued, "the waiters queued", 5.0, every_s=0.01)
        await late.ask(at)  # refused at once, before any slot frees
        assert late.refused is not None and late.refused.status == 429
        assert late.refused.retry_after_s == refused_retry_after
        assert "api.queue_timeout_s" in late.refused.message
        for client in [*holders, *waiters]:
            assert client.release is not None
            client.release.set()
    assert all(w.refused is None for w in waiters)
