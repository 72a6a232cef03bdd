"""A replay after a failed hop leaves every cache of the new route holding, position by
position, the bytes of a route that never failed, and the entry samples the next token from the
same logits: the prompt prefilled as the session's first step prefilled it, every token after
it as decode rows (swarm/inference/replay.py). On the embedded model's packed layers, which
users run: a prefill rounds differently from decode rows, so a replay of the whole history as
one prefill sent greedy text elsewhere a few tokens after the fault."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import torch

from harness.reference import Generated, greedy
from swarm.config import RuntimeConfig
from swarm.errors import HopFailedError
from swarm.inference.local import LocalSwarm, load_local
from swarm.inference.pipeline import LocalPipeline
from swarm.inference.replay import ReplayStep, replay_steps
from swarm.runtime.execution.chunks import prefill_chunks
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.types import LayerSpan, NodeId, SessionId


@pytest.mark.parametrize(
    ("tokens", "prefilled", "rows", "expected"),
    [
        # a fault during the prompt's prefill or at its first decode step: the prompt alone
        (5, 5, 4, [(0, 5, False)]),
        (6, 5, 4, [(0, 5, False), (5, 6, True)]),
        # the tokens after the prompt, in steps of at most `rows` decode rows
        (14, 5, 4, [(0, 5, False), (5, 9, True), (9, 13, True), (13, 14, True)]),
        (13, 5, 4, [(0, 5, False), (5, 9, True), (9, 13, True)]),
        # a prefilled count past the history (never given) is the history
        (3, 5, 4, [(0, 3, False)]),
    ],
)
def test_replay_steps(
    tokens: int, prefilled: int, rows: int, expected: list[tuple[int, int, bool]]
) -> None:
    assert replay_steps(tokens, prefilled, rows) == [ReplayStep(*e) for e in expected]


def test_replay_steps_need_a_row() -> None:
    with pytest.raises(ValueError, match="rows_per_step"):
        replay_steps(4, 2, 0)


SPAN = LayerSpan(0, 30)
PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain why rivers bend, in one paragraph.",
    "Describe how bread is baked in a small village. " * 4,
]
DECODED = [9, 4, 14]  # tokens each session decodes before the fault: replays of every length
CHUNK = 24  # prefill tokens a step: the longest prompt takes several chunks, as a hop cuts it


def _kv(shard: Shard, session: SessionId) -> list[torch.Tensor]:
    cache = shard.kv.get(session)
    keep = cache.length
    return [t[:, :, :keep] for t in (*cache._keys, *cache._values)]


def _prompts(entry: EntryModel) -> list[list[int]]:
    return [entry.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]


def _prefill(shard: Shard, entry: EntryModel, ids: list[list[int]]) -> list[torch.Tensor]:
    """Every session's prompt, chunk k of each in one call (a hop's PrefillBatcher)."""
    chunked = [prefill_chunks(len(p), CHUNK) for p in ids]
    last: list[torch.Tensor] = [torch.empty(0)] * len(ids)
    for k in range(max(len(c) for c in chunked)):
        who = [i for i, c in enumerate(chunked) if k < len(c)]
        steps = []
        for i in who:
            a, b = chunked[i][k]
            steps.append((SessionId(f"s{i}"), entry.embed(ids[i][a:b]), a))
        for i, out in zip(who, shard.prefill_batch(steps, SPAN), strict=True):
            assert isinstance(out, torch.Tensor), out
            last[i] = out[:, -1:]
    return last


@pytest.mark.slow
def test_batched_replays_rebuild_the_caches_a_route_that_never_failed_holds(
    smol_packed: RuntimeConfig,
) -> None:
    context = ModelContext.open(smol_packed, progress=False)
    entry = EntryModel(context)
    ids = _prompts(entry)
    sessions = [SessionId(f"s{i}") for i in range(len(ids))]
    # the route that never failed: prompts prefilled, then one decode step per token, every
    # session that still decodes in one call (a hop's DecodeBatcher)
    served = Shard.load(context, SPAN, smol_packed)
    last = _prefill(served, entry, ids)
    history = [list(p) for p in ids]
    for _ in range(max(DECODED) + 1):
        who = [i for i in range(len(ids)) if len(history[i]) - len(ids[i]) < DECODED[i] + 1]
        for i in who:
            history[i].append(int(entry.logits(last[i]).argmax()))
        steps = [(sessions[i], entry.embed(history[i][-1:]), len(history[i]) - 1) for i in who]
        for i, out in zip(who, served.decode_rows(steps, SPAN).outputs, strict=True):
            assert isinstance(out, torch.Tensor), out
            last[i] = out
    # the replays on a hop that takes over: each session's every token from position 0,
    # batched with the others' replays of other lengths, step k of each in one call
    taken = Shard.load(context, SPAN, smol_packed)
    plans = [replay_steps(len(h), len(p), CHUNK) for h, p in zip(history, ids, strict=True)]
    assert not plans[0][0].decode and all(len(plan) > 1 for plan in plans)
    _prefill(taken, entry, ids)  # every plan's first step is its prompt, cut as it was
    replayed: list[torch.Tensor] = [torch.empty(0)] * len(ids)
    for k in range(1, max(len(plan) for plan in plans)):
        who = [i for i, plan in enumerate(plans) if k < len(plan)]
        rows = [
            (
                sessions[i],
                entry.embed(history[i][plans[i][k].start : plans[i][k].end]),
                plans[i][k].start,
            )
            for i in who
        ]
        for i, out in zip(who, taken.decode_rows(rows, SPAN).outputs, strict=True):
            assert isinstance(out, torch.Tensor), out
            replayed[i] = out[:, -1:]
    for i, session in enumerate(sessions):
        mine, theirs = _kv(served, session), _kv(taken, session)
        assert len(mine) == len(theirs) == 2 * len(SPAN)
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True)), session
        assert torch.equal(last[i], replayed[i])
        assert torch.equal(entry.logits(last[i]), entry.logits(replayed[i]))


class _FailingAt(LocalPipeline):
    """One process whose steps fail at the given step numbers, as a hop dropped there: the
    generation re-routes (to the same shards) and replays. The fault sits at the pipeline,
    the seam a networked hop fails at."""

    def __init__(self, local: LocalPipeline, failing: set[int]) -> None:
        super().__init__(local.shards, local._compute, local._chunk_tokens)
        self.failing = failing
        self.steps = 0
        self.replays = 0

    async def forward(
        self, session: SessionId, hidden: torch.Tensor, position: int, verify: bool = False
    ) -> torch.Tensor:
        self.steps += 1
        if self.steps in self.failing:
            self.failing.discard(self.steps)
            raise HopFailedError("a hop dropped", NodeId("lost"))
        return await super().forward(session, hidden, position, verify)

    async def replay(
        self, session: SessionId, hidden: torch.Tensor, prefilled: int
    ) -> torch.Tensor:
        self.replays += 1
        return await super().replay(session, hidden, prefilled)


async def _greedy_with_faults(
    local: LocalSwarm, ids: Sequence[int], tokens: int, failing: set[int]
) -> tuple[Generated, int]:
    pipeline = _FailingAt(local.pipeline, set(failing))
    faulty = LocalSwarm(local.entry, pipeline, local.compute)
    return await greedy(faulty, ids, tokens), pipeline.replays


@pytest.mark.slow
def test_text_after_replays_is_the_text_without_them(smol_packed: RuntimeConfig) -> None:
    async def run() -> None:
        local = await load_local(smol_packed)
        try:
            for prompt in PROMPTS[:2]:
                ids = local.entry.encode_chat([{"role": "user", "content": prompt}])
                clean = await greedy(local, ids, 40)
                faulted, replays = await _greedy_with_faults(local, ids, 40, {1, 6, 19, 33})
                assert replays == 4
                assert faulted.token_ids == clean.token_ids
        finally:
            local.compute.close()

    asyncio.run(run())
