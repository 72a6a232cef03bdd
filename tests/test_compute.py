from __future__ import annotations

import asyncio
import threading
import time

import pytest

from swarm.errors import ComputeError
from swarm.runtime.execution.compute import ComputeThread


async def test_work_runs_off_the_event_loop_and_the_loop_stays_responsive() -> None:
    compute = ComputeThread(threads=1, queue_size=4)
    loop_thread = threading.get_ident()
    try:
        busy = asyncio.ensure_future(
            compute.run(lambda: (time.sleep(0.3), threading.get_ident())[1])
        )
        ticks = 0
        while not busy.done():
            await asyncio.sleep(0.01)
            ticks += 1
        assert busy.result() != loop_thread
        assert ticks >= 5  # the loop kept running while the job blocked its thread
    finally:
        compute.close()


async def test_jobs_run_one_at_a_time_in_order() -> None:
    compute = ComputeThread(queue_size=2)
    order: list[int] = []
    try:
        await asyncio.gather(*(compute.run(order.append, i) for i in range(6)))
        assert order == list(range(6))
    finally:
        compute.close()


async def test_errors_propagate_and_closed_thread_refuses() -> None:
    compute = ComputeThread()

    def boom() -> None:
        raise ValueError("bad tensor")

    with pytest.raises(ValueError, match="bad tensor"):
        await compute.run(boom)
    compute.close()
    with pytest.raises(ComputeError, match="closed"):
        await compute.run(print)


async def test_queue_depth_counts_the_jobs_waiting_behind_the_running_one() -> None:
    compute = ComputeThread(queue_size=8)
    gate = threading.Event()
    try:
        jobs = [asyncio.ensure_future(compute.run(gate.wait, 5.0)) for _ in range(4)]
        await asyncio.sleep(0)  # let every job enter the queue
        assert compute.queue_depth == 3
        gate.set()
        await asyncio.gather(*jobs)
        assert compute.queue_depth == 0
    finally:
        compute.close()


async def test_callers_waiting_their_turn_when_the_thread_closes_are_refused() -> None:
    compute = ComputeThread()
    gate = threading.Event()
    running = asyncio.ensure_future(compute.run(gate.wait, 5.0))
    waiting = asyncio.ensure_future(compute.run(print, "never"))
    await asyncio.sleep(0.05)
    closing = asyncio.ensure_future(asyncio.to_thread(compute.close))  # waits for the running job
    await asyncio.sleep(0.05)
    gate.set()
    assert await running is True
    with pytest.raises(ComputeError, match="closed"):
        await waiting
    await closing


def test_a_job_the_thread_posts_itself_runs_before_the_thread_waits_again() -> None:
    """The thread writes itself no wake-up byte (an entry's own next step is posted from
    there): the job it posts runs next all the same, and one posted from elsewhere still
    wakes it from its wait."""
    from swarm.runtime.execution.worker import Worker

    worker = Worker("test-worker")
    ran: list[str] = []
    done = threading.Event()

    def second() -> None:
        ran.append("second")
        done.set()

    def first() -> None:
        ran.append("first")
        worker.submit(second)

    try:
        time.sleep(0.05)  # the thread waits in select
        worker.submit(first)
        assert done.wait(5), ran
        assert ran == ["first", "second"]
        done.clear()
        time.sleep(0.05)
        worker.submit(second)  # from this thread again: it must wake the waiting one
        assert done.wait(5) and ran == ["first", "second", "second"]
    finally:
        worker.stop()
