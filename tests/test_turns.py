"""Who gets the compute thread next: the waiting caller with the most jobs, after the loop has
run what the finished job woke; nobody passed over for ever; and sessions that started apart
end up in one batch instead of taking turns in groups."""

from __future__ import annotations

import asyncio
import time

from swarm.inference.batching import ComputeBatcher
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.turns import Turns


async def _queue(
    turns: Turns,
    order: list[str],
    name: str,
    jobs: int,
    hold: asyncio.Event | None = None,
    given: asyncio.Event | None = None,
) -> asyncio.Task[None]:
    """A caller waiting for the thread; once given it, it notes its name, sets `given` and
    holds the thread until `hold` is set."""

    async def wait() -> None:
        await turns.acquire(lambda: jobs)
        order.append(name)
        if given is not None:
            given.set()
        if hold is not None:
            await hold.wait()
        turns.release()

    task = asyncio.create_task(wait())
    await asyncio.sleep(0)  # it is waiting now
    return task


async def test_the_biggest_waiting_batch_goes_first() -> None:
    turns = Turns()
    await turns.acquire(lambda: 1)
    order: list[str] = []
    tasks = [
        await _queue(turns, order, "prefill", 1),
        await _queue(turns, order, "heads", 7),
        await _queue(turns, order, "steps", 8),
    ]
    turns.release()
    await asyncio.gather(*tasks)
    assert order == ["steps", "heads", "prefill"]


async def test_a_waiter_passed_over_twice_goes_next() -> None:
    turns = Turns()
    await turns.acquire(lambda: 1)
    order: list[str] = []
    lone = await _queue(turns, order, "lone", 1)
    holds = [asyncio.Event() for _ in range(3)]
    given = [asyncio.Event() for _ in range(3)]
    bigs = [await _queue(turns, order, "big 0", 8, holds[0], given[0])]
    turns.release()
    for i in (1, 2):  # while one big batch runs, the next arrives
        await given[i - 1].wait()
        bigs.append(await _queue(turns, order, f"big {i}", 8, holds[i], given[i]))
        holds[i - 1].set()
    await lone
    assert order == ["big 0", "big 1", "lone"]
    holds[2].set()
    await asyncio.gather(*bigs)


async def test_a_waiter_cancelled_as_it_was_given_the_thread_passes_it_on() -> None:
    turns = Turns()
    await turns.acquire(lambda: 1)
    order: list[str] = []
    first = await _queue(turns, order, "first", 1)
    second = await _queue(turns, order, "second", 1)
    turns.release()
    first.cancel()
    await asyncio.wait_for(second, 2.0)
    assert order == ["second"]


async def test_sessions_that_start_apart_end_up_in_one_batch() -> None:
    """Eight sessions, each a layer step then a head step per token (two batchers sharing one
    thread, as on a node that is its own entry), started a few milliseconds apart."""
    compute = ComputeThread(queue_size=64)
    layer_sizes: list[int] = []

    def layers(jobs: list[str]) -> list[str]:
        layer_sizes.append(len(jobs))
        time.sleep(0.004 + 0.001 * len(jobs))
        return jobs

    def head(jobs: list[str]) -> list[str]:
        time.sleep(0.001 + 0.0005 * len(jobs))
        return jobs

    layer_batcher = ComputeBatcher(compute, layers, str, max_batch=8)
    head_batcher = ComputeBatcher(compute, head, str, max_batch=8)

    async def session(name: str, start_s: float) -> None:
        await asyncio.sleep(start_s)
        for _ in range(40):
            await layer_batcher.run(name)
            await head_batcher.run(name)

    try:
        await asyncio.gather(*(session(f"s{i}", 0.003 * i) for i in range(8)))
    finally:
        compute.close()
    merged = layer_sizes[10:-5]  # the first steps, before all have started; the last, as some end
    assert merged == [8] * len(merged), layer_sizes
