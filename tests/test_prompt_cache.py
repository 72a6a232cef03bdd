"""The prompt cache in one process: a prompt that starts as an earlier one did starts after
the blocks the shards kept from it, and every token is the one computing the whole prompt
gives. On the embedded model's packed layers, where a position's bits depend on the call
that computed it, and on the float32 layers."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import pytest
import torch

from harness.reference import Generated, answer
from swarm.config import RuntimeConfig
from swarm.inference.local import LocalSwarm, load_local
from swarm.sampling_settings import SamplingSettings

SYSTEM = (
    "You are a careful assistant for a small bakery. Answer in two sentences, name the "
    "ingredient that matters most, and never invent prices. "
) * 3
TURNS = [
    "How long should sourdough rise?",
    "And at a cold room temperature?",
    "What changes with whole wheat flour?",
]


async def _answer(
    local: LocalSwarm, ids: Sequence[int], params: SamplingSettings
) -> tuple[Generated, int]:
    """The answer, and the prompt positions that came from kept blocks."""
    generated, finish = await answer(local, ids, params)
    return generated, finish.cached_tokens


async def _conversation(
    local: LocalSwarm, cache: bool, seed: int | None
) -> list[tuple[Generated, int]]:
    """Three turns, each prompt the whole conversation so far, as chat clients send it."""
    messages = [{"role": "system", "content": SYSTEM}]
    answers = []
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        ids = local.entry.encode_chat(messages)
        params = SamplingSettings(
            max_tokens=24,
            temperature=0.8 if seed is not None else 0.0,
            seed=seed,
            cache_prompt=cache,
        )
        answer, cached = await _answer(local, ids, params)
        answers.append((answer, cached))
        messages.append({"role": "assistant", "content": answer.text})
    return answers


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["packed", "float32"])
async def test_a_conversation_with_the_prompt_cache_is_the_conversation_without_it(
    dtype: str, smol_packed: RuntimeConfig
) -> None:
    runtime = dataclasses.replace(smol_packed, dtype=dtype, prefill_chunk_tokens=32)  # type: ignore[arg-type]
    local = await load_local(runtime, "0:12,12:30")
    try:
        # float32 (torch's products) greedy only: the packed layers take every path it does
        for seed in (None, 3) if dtype == "packed" else (None,):
            cold = await _conversation(local, False, seed)
            warm = await _conversation(local, True, seed)
            assert [a.token_ids for a, _ in warm] == [a.token_ids for a, _ in cold], seed
            assert all(cached == 0 for _, cached in cold)
            # each turn starts from the blocks of the turn before; the second conversation's
            # first turn from the system prompt's, kept by the first (a request that does
            # not cache keeps nothing)
            cached = [c for _, c in warm]
            assert 0 < cached[1] < cached[2], cached
            assert (cached[0] > 0) == (seed is not None), cached
            assert all(c % 32 == 0 for c in cached)
    finally:
        local.compute.close()


async def test_a_prompt_cut_anywhere_after_a_kept_one_gives_the_tokens_of_a_cold_run(
    tiny_runtime: RuntimeConfig,
) -> None:
    """Every length of prompt that shares 0..3 blocks with one computed before it."""
    runtime = dataclasses.replace(tiny_runtime, prefill_chunk_tokens=4)
    local = await load_local(runtime, "0:1,1:4")
    try:
        first = [1, *range(5, 19)]
        params = SamplingSettings(max_tokens=6)
        await _answer(local, first, params)
        for cut in range(1, len(first) + 3):
            ids = [*first[:cut], *range(40, 40 + cut % 3)]
            cold, none = await _answer(local, ids, dataclasses.replace(params, cache_prompt=False))
            warm, cached = await _answer(local, ids, params)
            assert warm.token_ids == cold.token_ids, ids
            assert none == 0 and cached == min(cut, len(ids) - 1) // 4 * 4, ids
    finally:
        local.compute.close()


async def test_a_hop_starts_a_session_from_its_blocks_before_its_next_chunk_runs(
    tiny_runtime: RuntimeConfig,
) -> None:
    """The first chunk names kept blocks, the second arrives while the first is on its way
    to the compute thread: the hop runs them in order, and both results go on."""
    from swarm.inference.batching import PrefillBatcher
    from swarm.inference.hop import HopServer
    from swarm.inference.hop_core import HopCore
    from swarm.inference.hop_ledger import HopLedger
    from swarm.runtime.execution.compute import ComputeThread
    from swarm.runtime.execution.model import ModelContext
    from swarm.runtime.execution.serving import Serving
    from swarm.runtime.execution.shard import Shard
    from swarm.telemetry import SpeedMeter, StepCost
    from swarm.types import LayerSpan, NodeId, SessionId
    from swarm.wire import ErrorMessage, Hop, Peer, StepMessage

    context = ModelContext.open(tiny_runtime, progress=False)
    span = LayerSpan(0, context.num_layers)
    shard = Shard.load(context, span, tiny_runtime)
    width = context.hidden_size
    torch.manual_seed(0)
    shard.forward(SessionId("first"), torch.randn(1, 8, width), 0)
    shard.kv.keep(SessionId("first"), "a" * 32, 0, 4)
    sent: list[object] = []

    class Links:
        async def send(self, address: str, message: object) -> None:
            sent.append(message)

    compute = ComputeThread(1, 8)
    try:
        serving = Serving(shard)
        ledger = HopLedger(NodeId("me"), SpeedMeter(1.0, StepCost(0.0, 1.0, 0.0)))
        core = HopCore(NodeId("me"), serving, Links(), ledger)  # type: ignore[arg-type]
        hop = HopServer(
            core,
            compute,
            None,
            PrefillBatcher(compute, serving, 8, 256),  # type: ignore[arg-type]
        )
        route = (Hop(NodeId("me"), "me:1", span),)
        entry = Peer(NodeId("entry"), "entry:1")
        first = StepMessage(
            SessionId("s"), 1, 4, torch.randn(1, 4, width), route, entry, prefix=("a" * 32,)
        )
        second = StepMessage(SessionId("s"), 2, 8, torch.randn(1, 4, width), route, entry)
        await asyncio.gather(hop.step(first, 0.0, 0.0), hop.step(second, 0.0, 0.0))
        assert not [m for m in sent if isinstance(m, ErrorMessage)], sent
        assert len(sent) == 2 and shard.kv.get(SessionId("s")).length == 12
    finally:
        compute.close()


async def test_a_session_started_from_kept_blocks_replays_exactly_after_a_failed_hop(
    tiny_runtime: RuntimeConfig,
) -> None:
    """A hop fails a few tokens into an answer whose prompt started from kept blocks: the
    replay computes the prompt whole (its chunks cut where they always are), and the tokens
    are a cold run's."""
    from swarm.errors import HopFailedError
    from swarm.inference.pipeline import LocalPipeline, Prefilled
    from swarm.types import NodeId, SessionId

    class FailsOnce(LocalPipeline):
        steps = 0

        async def forward(
            self, session: SessionId, hidden: torch.Tensor, position: int, verify: bool = False
        ) -> torch.Tensor:
            self.steps += 1
            if self.steps == 4:
                raise HopFailedError("a hop dropped", NodeId("lost"))
            return await super().forward(session, hidden, position, verify)

        async def prefill(
            self, session: SessionId, hidden: torch.Tensor, token_ids: Sequence[int] | None
        ) -> Prefilled:
            prefilled = await super().prefill(session, hidden, token_ids)
            self.steps = 1
            return prefilled

    runtime = dataclasses.replace(tiny_runtime, prefill_chunk_tokens=4)
    local = await load_local(runtime, "0:1,1:4")
    try:
        first = [1, *range(5, 19)]
        params = SamplingSettings(max_tokens=8)
        await _answer(local, first, params)  # keeps its blocks
        ids = [*first, 30, 31]
        cold, _ = await _answer(local, ids, dataclasses.replace(params, cache_prompt=False))
        shards = local.pipeline
        failing = FailsOnce(shards.shards, shards._compute, 4, keep_prompts=True)
        warm, cached = await _answer(LocalSwarm(local.entry, failing, local.compute), ids, params)
        assert cached == 12 and failing.steps > 4
        assert warm.token_ids == cold.token_ids
    finally:
        local.compute.close()
