"""Continuous batching at a hop: decode steps of several sessions as one batched forward give
what running them one at a time gives (hidden states to float rounding, greedy tokens exactly),
and a bad step in a batch fails alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from swarm.config import RuntimeConfig
from swarm.errors import PositionMismatchError, SessionNotFoundError
from swarm.runtime.entry import EntryModel
from swarm.runtime.model import ModelContext
from swarm.runtime.shard import Shard
from swarm.types import LayerSpan, SessionId

PROMPTS = [
    "Write a short story about dragons.",
    "What is the capital of France?",
    "List three fruits that are red.",
    "Explain rain to a child in one paragraph, please.",
]
TOKENS = 16


def _greedy(entry: EntryModel, shard: Shard, batched: bool) -> list[list[int]]:
    """Greedy tokens for every prompt: decode steps one session at a time, or all in lockstep
    through decode_batch."""
    sessions = [SessionId(f"s{i}") for i in range(len(PROMPTS))]
    histories = [entry.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    outputs: list[torch.Tensor] = []
    for session, ids in zip(sessions, histories, strict=True):
        outputs.append(shard.forward(session, entry.embed(ids), 0)[:, -1:])
    generated: list[list[int]] = [[] for _ in PROMPTS]
    for _ in range(TOKENS):
        steps = []
        for i, out in enumerate(outputs):
            token = int(entry.logits(out).argmax())
            generated[i].append(token)
            histories[i].append(token)
            steps.append((sessions[i], entry.embed([token]), len(histories[i]) - 1))
        if batched:
            results = shard.decode_batch(steps, shard.span)
            outputs = [r for r in results if isinstance(r, torch.Tensor)]
            assert len(outputs) == len(steps)
        else:
            outputs = [shard.forward(s, h, p) for s, h, p in steps]
    return generated


@pytest.mark.slow
def test_batched_decode_gives_the_same_greedy_tokens_on_the_real_model(
    smol_runtime: RuntimeConfig,
) -> None:
    runtime = RuntimeConfig(cache_dir=smol_runtime.cache_dir, threads=1)
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    one_by_one = _greedy(entry, Shard.load(context, LayerSpan(0, 30), runtime), batched=False)
    batched = _greedy(entry, Shard.load(context, LayerSpan(0, 30), runtime), batched=True)
    assert batched == one_by_one


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_batched_hidden_states_match_one_at_a_time(tiny_runtime: RuntimeConfig, dtype: str) -> None:
    tiny_runtime = dataclasses.replace(tiny_runtime, dtype=dtype)  # type: ignore[arg-type]
    context = ModelContext.open(tiny_runtime, progress=False)
    entry = EntryModel(context)
    shards = [Shard.load(context, LayerSpan(1, 4), tiny_runtime) for _ in range(2)]
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]
    sessions = [SessionId(f"s{i}") for i in range(3)]
    for shard in shards:
        for session, ids in zip(sessions, prompts, strict=True):
            shard.forward(session, entry.embed(ids), 0)
    steps = [
        (s, entry.embed([40 + i]), len(p))
        for i, (s, p) in enumerate(zip(sessions, prompts, strict=True))
    ]
    batched = shards[0].decode_batch(steps, LayerSpan(1, 4))
    for (session, hidden, position), got in zip(steps, batched, strict=True):
        expected = shards[1].forward(session, hidden, position)
        assert isinstance(got, torch.Tensor)
        tolerance = 1e-5 if dtype == "float32" else 2e-2  # int8 products take bfloat16 inputs
        torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
    # a layer sub-range (a hop entered mid-span) batches too
    mid = [(s, entry.embed([50]), len(p) + 1) for s, p in zip(sessions, prompts, strict=True)]
    assert all(isinstance(r, torch.Tensor) for r in shards[0].decode_batch(mid, LayerSpan(1, 4)))


def test_a_bad_step_fails_alone_and_the_others_run(tiny_runtime: RuntimeConfig) -> None:
    context = ModelContext.open(tiny_runtime, progress=False)
    entry = EntryModel(context)
    shard = Shard.load(context, LayerSpan(0, 4), tiny_runtime)
    good = SessionId("good")
    shard.forward(good, entry.embed([1, 2, 3]), 0)
    steps = [
        (good, entry.embed([4]), 3),
        (SessionId("unknown"), entry.embed([4]), 7),  # no cache here
        (good, entry.embed([4]), 9),  # already in this batch and past the cache: refused
    ]
    ok, missing = shard.decode_batch(steps[:2], LayerSpan(0, 4))
    assert isinstance(ok, torch.Tensor) and isinstance(missing, SessionNotFoundError)
    (ahead,) = shard.decode_batch(steps[2:], LayerSpan(0, 4))
    assert isinstance(ahead, PositionMismatchError)
    assert shard.kv.sessions() == [good]
