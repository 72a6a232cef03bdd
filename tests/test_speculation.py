"""Speculative decoding in one process: drafted tokens verified in one step change nothing
of the text (greedy, seeded, constrained, cut by stop strings and max_tokens), and sampled
tokens keep their distribution."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from harness.family_models import PROMPT, SPECS, Checkpoint
from harness.family_runs import runtime_for
from harness.reference import NEW_TOKENS, PROMPTS
from harness.statistics import chi_square_p
from swarm.api.backend import Done, TokenLogprob
from swarm.api.formats import json_grammar
from swarm.config import RuntimeConfig, SpeculationConfig
from swarm.errors import HopFailedError
from swarm.inference.generation import Chunk, generate
from swarm.inference.head import EntryHead
from swarm.inference.local import LocalSwarm, load_local
from swarm.inference.pipeline import LocalPipeline
from swarm.sampling_settings import SamplingSettings
from swarm.types import NodeId, SessionId

# the kind of request drafting is for: the answer repeats runs of the prompt
REPEAT = "Repeat this sentence twice: the quick brown fox jumps over the lazy dog."
SPLITS = (None, "0:10,10:20,20:30")


@dataclass
class Run:
    tokens: list[int]
    text: str
    logprobs: list[TokenLogprob | None]
    finish: Done
    head: EntryHead


# random tiny models repeat little: lookups of any end, so that they draft at all
LOOSE = SpeculationConfig(ngram_max=3, ngram_min=1)
DEFAULTS = SpeculationConfig()


async def _run(
    local: LocalSwarm,
    ids: Sequence[int],
    params: SamplingSettings,
    speculate: bool,
    config: SpeculationConfig = LOOSE,
) -> Run:
    head = EntryHead(local.entry, local.compute, 1, replace(config, enabled=speculate))
    tokens: list[int] = []
    text: list[str] = []
    logprobs: list[TokenLogprob | None] = []
    finish = None
    constraint = None if params.grammar is None else local.entry.grammar.constraint(params.grammar)
    events = generate(
        local.entry, local.pipeline, local.compute, ids, params, None, head, constraint
    )
    async for event in events:
        if isinstance(event, Chunk):
            text.append(event.text)
            if event.token_id is not None:
                tokens.append(event.token_id)
                logprobs.append(event.logprob)
        else:
            finish = event
    assert finish is not None
    return Run(tokens, "".join(text), logprobs, finish, head)


@pytest.mark.slow
# float32 (torch's products) through the split only: the one-piece float32 case adds no path
# the split does not take, and costs half a minute
@pytest.mark.parametrize(
    ("dtype", "split"), [("float32", SPLITS[1]), ("packed", SPLITS[0]), ("packed", SPLITS[1])]
)
async def test_greedy_text_is_the_same_with_and_without_speculation(
    dtype: str, split: str | None, smol_runtime: RuntimeConfig
) -> None:
    runtime = RuntimeConfig(cache_dir=smol_runtime.cache_dir, dtype=dtype, threads=1)  # type: ignore[arg-type]
    local = await load_local(runtime, split)
    try:
        accepted = 0
        for prompt in [*PROMPTS, REPEAT]:
            ids = local.entry.encode_chat([{"role": "user", "content": prompt}])
            params = SamplingSettings(max_tokens=NEW_TOKENS)
            plain = await _run(local, ids, params, False, DEFAULTS)
            fast = await _run(local, ids, params, True, DEFAULTS)
            assert fast.tokens == plain.tokens, prompt
            assert fast.text == plain.text
            assert fast.finish.completion_tokens == len(fast.tokens)
            accepted += fast.head.drafts.accepted
        assert accepted > 0  # drafts were taken, so the comparison saw verify steps
    finally:
        local.compute.close()


@pytest.mark.parametrize("family", sorted(SPECS))
async def test_greedy_tokens_of_every_family_are_the_same_with_speculation(
    family: str,
    family_checkpoints: dict[tuple[str, str], Checkpoint],
    family_cache: Path,
) -> None:
    checkpoint = family_checkpoints[family, "hf"]
    for dtype in ("float32", "int8"):
        local = await load_local(
            runtime_for(checkpoint, family_cache, dtype), checkpoint.spec.split
        )
        try:
            ids = [*PROMPT[:8], *PROMPT[:8], *PROMPT[:6]]  # repeats, so lookups find drafts
            params = SamplingSettings(max_tokens=24)
            plain = await _run(local, ids, params, False)
            fast = await _run(local, ids, params, True)
            assert fast.tokens == plain.tokens
            assert fast.head.drafts.drafted > 0
        finally:
            local.compute.close()


async def test_a_seed_gives_the_same_sampled_text_with_and_without_speculation(
    tiny_runtime: RuntimeConfig,
) -> None:
    local = await load_local(tiny_runtime, "0:1,1:4")
    try:
        ids = [1, *([5, 6, 7, 8, 9] * 5)]
        drafted = 0
        for seed in range(6):
            params = SamplingSettings(max_tokens=16, temperature=0.7, top_k=4, seed=seed)
            plain = await _run(local, ids, params, False)
            fast = await _run(local, ids, params, True)
            again = await _run(local, ids, params, True)
            assert fast.tokens == plain.tokens == again.tokens
            drafted += fast.head.drafts.drafted
        assert drafted > 0
    finally:
        local.compute.close()


async def test_sampled_tokens_keep_their_distribution_with_speculation(
    tiny_runtime: RuntimeConfig,
) -> None:
    """Seeded runs with drafting against differently seeded runs without it: the tokens each
    position took, over every run, come from one distribution (chi-square, p > 0.01)."""
    local = await load_local(tiny_runtime, None)
    try:
        ids = [1, *([5, 6, 7, 8, 9] * 5)]
        runs = 150
        counts: list[Counter[int]] = [Counter(), Counter()]
        drafted = accepted = 0
        for arm, speculate in enumerate((True, False)):
            for i in range(runs):
                seed = i if speculate else 10_000 + i
                params = SamplingSettings(max_tokens=6, temperature=1.0, top_k=6, seed=seed)
                run = await _run(local, ids, params, speculate)
                counts[arm].update(p * 1000 + t for p, t in enumerate(run.tokens))
                drafted += run.head.drafts.drafted
                accepted += run.head.drafts.accepted
        assert accepted > 0 and drafted > accepted  # verify steps both kept and dropped drafts
        assert chi_square_p(*counts) > 0.01
    finally:
        local.compute.close()


async def test_stop_strings_and_max_tokens_cut_exactly_and_logprobs_come_from_the_target(
    tiny_runtime: RuntimeConfig,
) -> None:
    local = await load_local(tiny_runtime, None)
    try:
        ids = [1, *([5, 6, 7, 8, 9] * 5)]
        drafted = 0
        for max_tokens in (1, 2, 3, 7, 12):
            params = SamplingSettings(max_tokens=max_tokens, logprobs=2)
            plain = await _run(local, ids, params, False)
            fast = await _run(local, ids, params, True)
            assert fast.tokens == plain.tokens and fast.text == plain.text
            assert fast.logprobs == plain.logprobs and fast.logprobs[0] is not None
            assert len(fast.tokens) <= max_tokens
            assert (fast.finish.finish_reason, fast.finish.completion_tokens) == (
                plain.finish.finish_reason,
                plain.finish.completion_tokens,
            )
            drafted += fast.head.drafts.accepted
        assert drafted > 0
        text = (await _run(local, ids, SamplingSettings(max_tokens=12), False)).text
        stop = text[len(text) // 3 : len(text) // 3 + 3]
        assert stop.strip()
        cut = SamplingSettings(max_tokens=12, stop=(stop,))
        plain = await _run(local, ids, cut, False)
        fast = await _run(local, ids, cut, True)
        assert fast.text == plain.text and stop not in fast.text
        assert fast.finish.finish_reason == "stop" and fast.tokens == plain.tokens
    finally:
        local.compute.close()


@pytest.mark.slow
async def test_a_grammar_masks_and_advances_per_accepted_token(smol_runtime: RuntimeConfig) -> None:
    local = await load_local(RuntimeConfig(cache_dir=smol_runtime.cache_dir, threads=1))
    try:
        prompt = (
            'Reply with this JSON exactly: {"name": "desk lamp", "tags": ["desk", "light"], '
            '"name2": "desk lamp"}'
        )
        ids = local.entry.encode_chat([{"role": "user", "content": prompt}])
        schema = {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["name", "tags"],
        }
        grammar = json_grammar(schema, "response_format")
        params = SamplingSettings(max_tokens=40, grammar=grammar)
        plain = await _run(local, ids, params, False, DEFAULTS)
        fast = await _run(local, ids, params, True, DEFAULTS)
        assert fast.tokens == plain.tokens and fast.text == plain.text
        assert fast.text.startswith("{") and '"tags"' in fast.text
        assert fast.head.drafts.accepted > 0
    finally:
        local.compute.close()


class _VerifyStepsFail(LocalPipeline):
    """One process whose first `failing` verify steps fail, as a hop dropped during them:
    the generation re-routes (to the same shards) and replays, and the drafts go unverified.
    Where a kill lands on real nodes is chance; here it lands on a verify step every time."""

    def __init__(self, local: LocalPipeline, failing: int) -> None:
        super().__init__(local.shards, local._compute, local._chunk_tokens)
        self.failing = failing
        self.replaying = False

    async def forward(
        self, session: SessionId, hidden: torch.Tensor, position: int, verify: bool = False
    ) -> torch.Tensor:
        if verify and self.failing and not self.replaying:  # a replay's steps verify too
            self.failing -= 1
            raise HopFailedError("a hop dropped during a verify step", NodeId("lost"))
        return await super().forward(session, hidden, position, verify)

    async def replay(
        self, session: SessionId, hidden: torch.Tensor, prefilled: int
    ) -> torch.Tensor:
        self.replaying = True
        try:
            return await super().replay(session, hidden, prefilled)
        finally:
            self.replaying = False


async def test_a_hop_failed_during_verify_steps_drops_their_drafts_and_changes_no_token(
    tiny_runtime: RuntimeConfig,
) -> None:
    local = await load_local(tiny_runtime, "0:1,1:4")
    try:
        ids = [1, *([5, 6, 7, 8, 9] * 5)]
        params = SamplingSettings(max_tokens=16)
        plain = await _run(local, ids, params, False)
        faulty = LocalSwarm(local.entry, _VerifyStepsFail(local.pipeline, 2), local.compute)
        fast = await _run(faulty, ids, params, True)
        assert fast.tokens == plain.tokens
        assert fast.head.drafts.unverified == 2
        assert fast.head.drafts.accepted > 0  # verify steps after the faults went through
    finally:
        local.compute.close()
