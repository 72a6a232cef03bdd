"""An embedding request at the entry: each input's tokens prefilled through the swarm as a
prompt is (the same chunks, sessions and hops, so the bits are one process's), its states
after the final norm pooled (`pooling.py`), the session closed on every hop. Nothing of it
is kept as a prompt block, and no token is sampled."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence

import torch

from swarm.errors import HopFailedError
from swarm.inference.pipeline import Pipeline
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.pooling import Pooling, every_row, pool, unit
from swarm.types import SessionId

log = logging.getLogger(__name__)

_MAX_RECOVERIES = 3  # re-routes of one input's prefill before the request fails
_RECOVERY_BACKOFF_S = 0.5  # seconds times the attempt number, from the second re-route on


async def embed_all(
    entry: EntryModel,
    pipeline: Pipeline,
    compute: ComputeThread,
    inputs: Sequence[Sequence[int]],
    pooling: Pooling,
    normalize: bool = True,
    at_once: int = 1,
) -> list[list[float]]:
    """One vector per input, in order; `at_once` inputs in flight together (their sessions
    spread over the routes and their chunks batch at each hop, as concurrent prompts do);
    `normalize`: at unit length."""
    gate = asyncio.Semaphore(max(1, at_once))

    async def one(ids: Sequence[int]) -> list[float]:
        async with gate:
            return await embed_one(entry, pipeline, compute, ids, pooling, normalize)

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(ids)) for ids in inputs]
    return [task.result() for task in tasks]


async def embed_one(
    entry: EntryModel,
    pipeline: Pipeline,
    compute: ComputeThread,
    ids: Sequence[int],
    pooling: Pooling,
    normalize: bool = True,
) -> list[float]:
    """The pooled vector of `ids` ([hidden] as floats), its session closed however it ends."""
    session = SessionId(uuid.uuid4().hex)
    try:
        hidden = await compute.run(entry.embed, ids)
        out = await _prefill(pipeline, session, hidden, every_row(pooling))
        return await compute.run(_pooled, entry, out, pooling, normalize)
    finally:
        await pipeline.close(session)


async def _prefill(
    pipeline: Pipeline, session: SessionId, hidden: torch.Tensor, rows: bool
) -> torch.Tensor:
    """The prompt from position 0; where a hop fails, the pipeline routes around it and the
    prompt goes again from position 0 (a prefill's replay is the prefill itself)."""
    for attempt in range(_MAX_RECOVERIES + 1):
        try:
            if rows:
                return await pipeline.prefill_rows(session, hidden)
            return await pipeline.forward(session, hidden, 0)
        except HopFailedError as e:
            if attempt == _MAX_RECOVERIES:
                raise
            log.warning("session %s: hop %s failed (%s); re-routing", session, e.node_id, e)
            await asyncio.sleep(_RECOVERY_BACKOFF_S * attempt)  # views catch up after a move
            await pipeline.recover(session, e.node_id)  # NoRouteError: none is left
    raise AssertionError("unreachable")


def _pooled(
    entry: EntryModel, hidden: torch.Tensor, pooling: Pooling, normalize: bool
) -> list[float]:
    """Runs on the compute thread: hidden [1, rows, hidden] (every position, or the last)."""
    rows = hidden if every_row(pooling) else hidden[:, -1:]
    vector = pool(entry.normed(rows), pooling)
    out: list[float] = (unit(vector) if normalize else vector).tolist()
    return out
