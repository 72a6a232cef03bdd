"""Continuous batching at a hop and at the entry: decode steps of several sessions as one
batched forward, and their heads as one product with lm_head, give what running them one at a
time gives (hidden states to float rounding, greedy tokens exactly), and a bad step in a batch
fails alone."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from swarm.config import RuntimeConfig
from swarm.errors import PositionMismatchError, SessionNotFoundError
from swarm.inference.head import EntryHead, HeadJob, Sampled
from swarm.inference.thread_steps import own_step_rounds
from swarm.runtime.execution.compute import ComputeThread
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.sampling import Sampler
from swarm.runtime.execution.shard import Shard
from swarm.runtime.execution.turns import SETTLE_ROUNDS
from swarm.runtime.weights import native
from swarm.sampling_settings import SamplingSettings
from swarm.types import LayerSpan, SessionId

PROMPTS = [
    "Write a short story about dragons.",
    "What is the capital of France?",
    "List three fruits that are red.",
    "Explain rain to a child in one paragraph, please.",
]
TOKENS = 16


def _greedy(entry: EntryModel, shard: Shard, batched: bool) -> list[list[int]]:
    """Greedy tokens for every prompt: decode steps and heads one session at a time, or all in
    lockstep through decode_batch and one head product."""
    sessions = [SessionId(f"s{i}") for i in range(len(PROMPTS))]
    histories = [entry.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    outputs: list[torch.Tensor] = []
    for session, ids in zip(sessions, histories, strict=True):
        outputs.append(shard.forward(session, entry.embed(ids), 0)[:, -1:])
    generated: list[list[int]] = [[] for _ in PROMPTS]
    for _ in range(TOKENS):
        steps = []
        logits = entry.last_logits(outputs) if batched else [entry.logits(o) for o in outputs]
        for i in range(len(outputs)):
            token = int(logits[i].argmax())
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


@pytest.mark.skipif(not native.available(), reason="swarm's kernels are not built for this CPU")
def test_on_swarms_kernels_a_batched_step_is_the_same_bits_as_one_at_a_time(
    tiny_runtime: RuntimeConfig,
) -> None:
    """Products and decode attention compute each session's row alone, so batching changes
    nothing, even in the last bit."""
    tiny_runtime = dataclasses.replace(tiny_runtime, dtype="int8")
    context = ModelContext.open(tiny_runtime, progress=False)
    entry = EntryModel(context)
    shards = [Shard.load(context, LayerSpan(0, 4), tiny_runtime) for _ in range(2)]
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13], list(range(20, 90))]
    sessions = [SessionId(f"s{i}") for i in range(len(prompts))]
    for shard in shards:
        for session, ids in zip(sessions, prompts, strict=True):
            shard.forward(session, entry.embed(ids), 0)
    for extra in range(3):  # positions grow: each step reads the keys the last one wrote
        steps = [
            (s, entry.embed([40 + i + extra]), len(p) + extra)
            for i, (s, p) in enumerate(zip(sessions, prompts, strict=True))
        ]
        batched = shards[0].decode_batch(steps, LayerSpan(0, 4))
        for (session, hidden, position), got in zip(steps, batched, strict=True):
            assert isinstance(got, torch.Tensor)
            assert torch.equal(got, shards[1].forward(session, hidden, position))


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


async def _sample_all(head: EntryHead, jobs: list[HeadJob]) -> list[Sampled]:
    return list(await asyncio.gather(*(head.sample(job) for job in jobs)))


def test_the_entry_head_batches_sessions_and_samples_each_as_alone(
    tiny_runtime: RuntimeConfig,
) -> None:
    context = ModelContext.open(tiny_runtime, progress=False)
    entry = EntryModel(context)
    shard = Shard.load(context, LayerSpan(0, 4), tiny_runtime)
    histories = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]
    outs = [shard.forward(SessionId(f"s{i}"), entry.embed(h), 0) for i, h in enumerate(histories)]
    params = [
        SamplingSettings(logprobs=3),
        SamplingSettings(temperature=0.8, seed=7, top_k=20),
        SamplingSettings(repetition_penalty=1.3, logit_bias=((14, 5.0),)),
    ]

    def jobs() -> list[HeadJob]:  # fresh samplers: a seeded one's generator advances
        return [
            HeadJob(SessionId(f"s{i}"), Sampler(p, len(h)), out, h)
            for i, (p, h, out) in enumerate(zip(params, histories, outs, strict=True))
        ]

    compute = ComputeThread(threads=1)
    try:
        together = EntryHead(entry, compute, max_batch=8)
        assert together.ms_per_session == 0.0  # nothing measured yet
        batched = asyncio.run(_sample_all(together, jobs()))
        assert together.batcher.batches == 1 and together.batcher.jobs == 3
        assert together.ms_per_session > 0.0  # what routing counts as the entry's own work
        alone = [asyncio.run(_sample_all(EntryHead(entry, compute), [job]))[0] for job in jobs()]
    finally:
        compute.close()
    for got, expected in zip(batched, alone, strict=True):
        assert got.token == expected.token
        torch.testing.assert_close(got.next_input, expected.next_input)
    assert batched[0].logprob is not None and alone[0].logprob is not None
    assert batched[0].logprob.token == alone[0].logprob.token
    assert batched[0].logprob.logprob == pytest.approx(alone[0].logprob.logprob, abs=1e-4)


def test_a_batch_takes_one_step_per_session_in_order_up_to_its_size() -> None:
    from swarm.inference.batching import one_per_session

    cases = [  # waiting sessions, max batch, batch, rest
        ([], 4, [], []),
        (["a"], 1, ["a"], []),
        (["a", "b", "c"], 4, ["a", "b", "c"], []),
        (["a", "a", "b"], 4, ["a", "b"], ["a"]),
        (["a", "b", "c"], 2, ["a", "b"], ["c"]),
        (["a", "a", "a"], 1, ["a"], ["a", "a"]),
    ]
    for waiting, size, batch, rest in cases:
        items = list(enumerate(waiting))
        taken, left = one_per_session(items, lambda item: item[1], size)
        assert [s for _, s in taken] == batch and [s for _, s in left] == rest
        assert sorted(taken + left) == items  # nothing lost, nothing twice


def test_the_head_run_where_a_result_arrives_samples_what_the_generation_would(
    tiny_runtime: RuntimeConfig,
) -> None:
    """A plain decode step's head, run on the compute thread as its result arrives, draws the
    same tokens from the same samplers (one product for every result of a round) as the
    head the generation asks; it runs only on results of steps the entry still awaits, and
    a step it ran on stays answered whatever its deadline says."""
    from swarm.inference.waiters import StepWaiters
    from swarm.wire import ResultMessage

    context = ModelContext.open(tiny_runtime, progress=False)
    entry = EntryModel(context)
    shard = Shard.load(context, LayerSpan(0, 4), tiny_runtime)
    histories = [[5, 6, 7], [8, 9, 10, 11, 12]]
    outs = [shard.forward(SessionId(f"s{i}"), entry.embed(h), 0) for i, h in enumerate(histories)]
    params = [SamplingSettings(logprobs=2), SamplingSettings(temperature=0.9, seed=3, top_k=30)]

    def samplers() -> list[Sampler]:  # fresh: a seeded one's generator advances
        return [Sampler(p, len(h)) for p, h in zip(params, histories, strict=True)]

    async def scenario() -> tuple[list[Sampled], list[Sampled], bool, bool]:
        waiters = StepWaiters()
        compute = ComputeThread(threads=1)
        try:
            head = EntryHead(entry, compute, max_batch=8)
            asked = [
                await head.sample(HeadJob(SessionId(f"s{i}"), sampler, out[:, -1:], h))
                for i, (sampler, h, out) in enumerate(zip(samplers(), histories, outs, strict=True))
            ]
            assert not head.arm(SessionId("s0"), samplers()[0], histories[0])  # not enabled
            head = EntryHead(entry, compute, max_batch=8, claim=waiters.claim)
            results = []
            for i, (sampler, h, out) in enumerate(zip(samplers(), histories, outs, strict=True)):
                session = SessionId(f"s{i}")
                assert head.arm(session, sampler, h)
                waiters.expect(session, 10 + i)
                results.append(ResultMessage(session, 10 + i, len(h) - 1, out[:, -1:]))
            stale = ResultMessage(SessionId("s0"), 9, 2, outs[0][:, -1:])  # no longer awaited
            assert not head.claims(stale)
            assert all(head.claims(r) for r in results)
            await compute.run(head.run_claimed, results)
            assert head.thread_batches == 1 and head.thread_steps == 2
            ran = [
                await head.sample(HeadJob(SessionId(f"s{i}"), samplers()[i], out, h))
                for i, (h, out) in enumerate(zip(histories, outs, strict=True))
            ]
            claimed = waiters.claimed(SessionId("s1"), 11)
            waiters.forget(SessionId("s1"), 11)
            return asked, ran, claimed, waiters.claimed(SessionId("s1"), 11)
        finally:
            compute.close()

    asked, ran, claimed, after_forget = asyncio.run(scenario())
    assert claimed and not after_forget
    for got, expected in zip(ran, asked, strict=True):
        assert got.ran_ms is not None and expected.ran_ms is None
        assert got.token == expected.token
        assert torch.equal(got.next_input, expected.next_input)
    assert ran[0].logprob is not None and ran[0].logprob == asked[0].logprob


@pytest.mark.parametrize(
    ("streams", "rounds"),
    [(None, SETTLE_ROUNDS), (0, 0), (1, 0), (2, SETTLE_ROUNDS), (8, SETTLE_ROUNDS)],
)
def test_a_lone_requests_own_step_goes_to_the_compute_thread_at_once(
    streams: int | None, rounds: int
) -> None:
    assert own_step_rounds(streams) == rounds


def test_sessions_that_draft_together_embed_their_verify_inputs_in_one_call(
    tiny_runtime: RuntimeConfig,
) -> None:
    """Each session's verify step needs its token and drafts embedded: asked together, they
    are one job on the compute thread, the embeddings each session's own call gives."""
    context = ModelContext.open(tiny_runtime, progress=False)
    entry = EntryModel(context)
    inputs = [[5, 6, 7], [8, 9], [10]]

    async def scenario() -> list[torch.Tensor]:
        compute = ComputeThread(threads=1)
        try:
            head = EntryHead(entry, compute, max_batch=8)
            outs = await asyncio.gather(
                *(head.embed(SessionId(f"s{i}"), tokens) for i, tokens in enumerate(inputs))
            )
            assert head.embeds.batches == 1 and head.embeds.jobs == len(inputs)
            return list(outs)
        finally:
            compute.close()

    for out, tokens in zip(asyncio.run(scenario()), inputs, strict=True):
        assert torch.equal(out, entry.embed(tokens))
