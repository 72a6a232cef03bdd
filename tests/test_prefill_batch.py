"""Prefill chunks of several sessions in one call give each session the bits of its own
prefill: its output, its cache (the decode step after it reads that cache) and so its greedy
text. On the embedded model, in float32 (torch's products, one session at a time) and packed
(swarm's kernels, every session's rows in one product)."""

from __future__ import annotations

import pytest
import torch

from swarm.config import RuntimeConfig
from swarm.errors import SessionNotFoundError
from swarm.runtime.execution.chunks import prefill_chunks
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import PrefillStep, Shard
from swarm.runtime.weights import native
from swarm.types import LayerSpan, SessionId

PROMPTS = [
    "Write a short story about dragons. " * 9,
    "What is the capital of France?",
    "Explain rain to a child in one paragraph, please. " * 5,
    "Hi",
]
CHUNK = 64  # tokens: the longer prompts take two or more chunks, as a replay does
SPAN = LayerSpan(0, 30)


def _chunks(entry: EntryModel) -> list[list[PrefillStep]]:
    """Each session's prefill as its chunks, in order."""
    out = []
    for i, prompt in enumerate(PROMPTS):
        hidden = entry.embed(entry.encode_chat([{"role": "user", "content": prompt}]))
        session = SessionId(f"s{i}")
        out.append(
            [(session, hidden[:, a:b], a) for a, b in prefill_chunks(hidden.shape[1], CHUNK)]
        )
    return out


def _decode_after(shard: Shard, entry: EntryModel, steps: list[list[PrefillStep]]) -> list[int]:
    """One greedy decode step per session on the cache its prefill left."""
    tokens = []
    for chunks in steps:
        session, hidden, position = chunks[-1]
        out = shard.forward(session, entry.embed([42]), position + hidden.shape[1])
        tokens.append(int(entry.logits(out).argmax()))
    return tokens


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "packed"])
def test_batched_prefill_gives_each_session_the_bits_of_its_own(
    smol_runtime: RuntimeConfig, dtype: str
) -> None:
    runtime = RuntimeConfig(cache_dir=smol_runtime.cache_dir, threads=1, dtype=dtype)  # type: ignore[arg-type]
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    alone, together = (Shard.load(context, SPAN, runtime) for _ in range(2))
    steps = _chunks(entry)
    own = [[alone.forward(s, h, p) for s, h, p in chunks] for chunks in steps]
    # lockstep, as a hop runs replays that a fault started together: chunk k of every
    # session that has one, in one call
    batched: list[list[torch.Tensor]] = [[] for _ in steps]
    for k in range(max(len(c) for c in steps)):
        who = [i for i, chunks in enumerate(steps) if k < len(chunks)]
        results = together.prefill_batch([steps[i][k] for i in who], SPAN)
        for i, result in zip(who, results, strict=True):
            assert isinstance(result, torch.Tensor), result
            batched[i].append(result)
    for mine, theirs in zip(own, batched, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            assert torch.equal(a, b)
    assert _decode_after(alone, entry, steps) == _decode_after(together, entry, steps)
    # packed on swarm's kernels: the rows of every session went through one product
    assert together.block(0).native_steps == (dtype == "packed" and native.available())  # type: ignore[attr-defined]


def test_a_chunk_that_fails_fails_alone(smol_runtime: RuntimeConfig) -> None:
    runtime = RuntimeConfig(cache_dir=smol_runtime.cache_dir, threads=1)
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    shard = Shard.load(context, LayerSpan(0, 4), runtime)
    good: PrefillStep = (SessionId("a"), entry.embed([5, 6, 7, 8]), 0)
    lost: PrefillStep = (SessionId("b"), entry.embed([9, 10]), 12)  # no cache to extend
    results = shard.prefill_batch([good, lost], LayerSpan(0, 4))
    assert isinstance(results[1], SessionNotFoundError)
    alone = Shard.load(context, LayerSpan(0, 4), runtime)
    assert torch.equal(results[0], alone.forward(*good, LayerSpan(0, 4)))  # type: ignore[arg-type]
