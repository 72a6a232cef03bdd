"""A draft model at the entry: its tokens are the draft model's greedy continuation, its cache
follows the text back after a rejection, and verifying its drafts changes nothing of the text
(greedy or seeded) or of the sampled distribution; a model of another vocabulary is refused."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from harness.factories import write_tiny_bytes_llama, write_tiny_llama
from harness.statistics import chi_square_p
from swarm.config import RuntimeConfig, SpeculationConfig
from swarm.errors import ConfigError
from swarm.inference.generation import Chunk, generate
from swarm.inference.head import EntryHead
from swarm.inference.local import LocalSwarm, load_local
from swarm.runtime.execution.draft_model import DraftModel
from swarm.sampling_settings import SamplingSettings
from swarm.types import SessionId

# no repeats in the prompt: the lookup drafts only once a random model's answer loops
IDS = [1, 17, 93, 250, 4, 61, 7, 150, 33, 201, 9, 88]
LOOKUPS_MISS = SpeculationConfig(ngram_max=6, ngram_min=6)


@pytest.fixture(scope="module")
def other_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another random tiny Llama of the same vocabulary, one layer: drafts mostly wrong."""
    folder = tmp_path_factory.mktemp("other-tiny")
    write_tiny_llama(folder, seed=5, num_hidden_layers=1)
    return folder


async def _tokens(
    local: LocalSwarm,
    params: SamplingSettings,
    draft: DraftModel | None,
    speculate: bool = True,
) -> tuple[list[int], EntryHead]:
    config = replace(LOOKUPS_MISS, enabled=speculate)
    head = EntryHead(local.entry, local.compute, 1, config, draft)
    tokens = []
    async for event in generate(
        local.entry, local.pipeline, local.compute, IDS, params, None, head
    ):
        if isinstance(event, Chunk) and event.token_id is not None:
            tokens.append(event.token_id)
    return tokens, head


async def _draft(local: LocalSwarm, model: str, runtime: RuntimeConfig) -> DraftModel:
    return await local.compute.run(DraftModel.load, model, runtime, local.entry)


async def test_drafts_are_the_draft_models_greedy_tokens_after_any_rewind(
    tiny_runtime: RuntimeConfig,
) -> None:
    local = await load_local(tiny_runtime)
    try:
        draft = await _draft(local, tiny_runtime.model, tiny_runtime)
        greedy, _ = await _tokens(local, SamplingSettings(max_tokens=8), None, False)

        async def propose(session: str, tokens: list[int], limit: int) -> list[int]:
            proposal = await local.compute.run(draft.propose, SessionId(session), tokens, limit)
            assert proposal.drafting_ms >= 0
            return proposal.tokens

        assert await propose("a", IDS, 6) == greedy[:6]
        # the target took two drafts and then another token: the cache rewinds to the shared
        # prefix and goes on from the new text
        diverged = [*IDS, *greedy[:2], (greedy[2] + 1) % 300]
        fresh = await propose("b", diverged, 4)
        assert await propose("a", diverged, 4) == fresh
        assert await propose("a", IDS, 3) == greedy[:3]  # further back
        assert await propose("a", [*IDS, *greedy[:5]], 1) == greedy[5:6]  # a text it drafted
        assert await propose("a", IDS, 0) == []
        draft.close(SessionId("a"))
        draft.close(SessionId("b"))
        assert not draft._fed
    finally:
        local.compute.close()


@pytest.mark.parametrize("split", [None, "0:1,1:4"])
async def test_greedy_text_is_the_same_with_a_draft_model(
    split: str | None, tiny_runtime: RuntimeConfig, other_tiny: Path
) -> None:
    local = await load_local(tiny_runtime, split)
    try:
        params = SamplingSettings(max_tokens=20)
        plain, _ = await _tokens(local, params, None, False)
        for model, all_taken in ((tiny_runtime.model, True), (str(other_tiny), False)):
            draft = await _draft(local, model, tiny_runtime)
            fast, head = await _tokens(local, params, draft)
            assert fast == plain, model
            counts = head.drafts
            assert 0 < counts.model_drafted <= counts.drafted
            if all_taken:  # the target drafting for itself: every draft is taken
                assert counts.model_accepted == counts.model_drafted
            assert not draft._fed  # the session's draft cache went with it
    finally:
        local.compute.close()


async def test_sampled_tokens_keep_their_distribution_with_a_draft_model(
    tiny_runtime: RuntimeConfig,
) -> None:
    """The draft model's tokens are its argmax, a function of the text: the target's sample at
    each position decides, so a seed gives the text it gives without drafts, and the tokens
    over many seeds come from one distribution (chi-square, p > 0.01)."""
    local = await load_local(tiny_runtime)
    try:
        draft = await _draft(local, tiny_runtime.model, tiny_runtime)
        counts: list[Counter[int]] = [Counter(), Counter()]
        accepted = drafted = 0
        for arm, speculate in enumerate((True, False)):
            for i in range(120):
                seed = i if speculate else 10_000 + i
                params = SamplingSettings(max_tokens=6, temperature=1.0, top_k=6, seed=seed)
                tokens, head = await _tokens(local, params, draft, speculate)
                if speculate and i < 5:
                    assert tokens == (await _tokens(local, params, None, False))[0]
                counts[arm].update(p * 1000 + t for p, t in enumerate(tokens))
                drafted += head.drafts.model_drafted
                accepted += head.drafts.model_accepted
        assert 0 < accepted < drafted  # verify steps both kept and dropped drafts
        assert chi_square_p(*counts) > 0.01
    finally:
        local.compute.close()


async def test_a_draft_model_of_another_vocabulary_is_refused_in_one_line(
    tiny_runtime: RuntimeConfig, tmp_path: Path
) -> None:
    other = tmp_path / "bytes-llama"
    write_tiny_bytes_llama(other)
    local = await load_local(tiny_runtime)
    try:
        with pytest.raises(ConfigError) as refused:
            await _draft(local, str(other), tiny_runtime)
        message = str(refused.value)
        assert message.startswith(f"draft model {other} does not share the target's vocabulary")
        assert "\n" not in message
    finally:
        local.compute.close()
