"""A long prefill runs in chunks: offsets cover the prompt exactly, a chunked prefill gives what
one step gives (to float rounding), and a split pipeline computes the very same numbers as one
shard, which is what lets a swarm answer exactly as one process does."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools

import pytest
import torch

from swarm.config import RuntimeConfig
from swarm.inference.local import load_local
from swarm.runtime.execution.chunks import prefill_chunks
from swarm.types import SessionId


@pytest.mark.parametrize(
    ("tokens", "size", "start", "expected"),
    [
        (1, 4, 0, [(0, 1)]),
        (4, 4, 0, [(0, 4)]),
        (5, 4, 0, [(0, 4), (4, 5)]),
        (9, 4, 0, [(0, 4), (4, 8), (8, 9)]),
        # a prefill that starts past position 0 (after a kept prefix) is cut where one from
        # position 0 would be: its chunks end at the same multiples of the size
        (10, 4, 3, [(0, 1), (1, 5), (5, 9), (9, 10)]),
        (8, 4, 4, [(0, 4), (4, 8)]),
        (0, 4, 0, [(0, 0)]),
    ],
)
def test_chunks_end_at_fixed_positions(
    tokens: int, size: int, start: int, expected: list[tuple[int, int]]
) -> None:
    assert prefill_chunks(tokens, size, start) == expected


@pytest.mark.parametrize(("tokens", "size"), [(1, 4), (4, 4), (5, 4), (1024, 256), (1000, 256)])
def test_chunks_cover_the_prompt_in_order_and_none_is_too_long(tokens: int, size: int) -> None:
    chunks = prefill_chunks(tokens, size)
    assert chunks[0][0] == 0 and chunks[-1][1] == tokens
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
    assert max(end - start for start, end in chunks) <= size


def test_a_chunk_needs_a_size() -> None:
    with pytest.raises(ValueError, match="positive size"):
        prefill_chunks(4, 0)


async def _last_hidden(runtime: RuntimeConfig, split: str | None, ids: list[int]) -> torch.Tensor:
    local = await load_local(runtime, split)
    try:
        hidden = await local.compute.run(local.entry.embed, ids)
        out = await local.pipeline.forward(SessionId("s"), hidden, 0)
        step = await local.compute.run(local.entry.embed, [7])  # a decode step after it
        after = await local.pipeline.forward(SessionId("s"), step, len(ids))
        return torch.cat([out[:, -1:], after])
    finally:
        local.compute.close()


def test_a_chunked_prefill_matches_one_step_and_a_split_matches_one_shard(
    tiny_runtime: RuntimeConfig,
) -> None:
    ids = list(range(3, 3 + 37))
    whole = dataclasses.replace(tiny_runtime, prefill_chunk_tokens=4096)
    chunked = dataclasses.replace(tiny_runtime, prefill_chunk_tokens=8)
    one_step = asyncio.run(_last_hidden(whole, None, ids))
    in_chunks = asyncio.run(_last_hidden(chunked, None, ids))
    torch.testing.assert_close(in_chunks, one_step, rtol=1e-4, atol=1e-4)
    split = asyncio.run(_last_hidden(chunked, "0:2,2:4", ids))
    assert torch.equal(split, in_chunks)
