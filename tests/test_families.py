"""Every supported family, from a Hugging Face folder and from GGUF (where swarm reads the
family's): greedy tokens equal
transformers' own `generate` on the same weights, whole and split three ways, for a session
longer than four sliding windows; int8 weights split equal int8 weights whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.family_models import NEW_TOKENS, PROMPT, WINDOW, Checkpoint, family_formats
from harness.family_runs import runtime_for, swarm_tokens
from swarm.config import RuntimeConfig
from swarm.inference.local import load_local
from swarm.types import SessionId

INT8_TOKENS = 12


async def swarm_logits(runtime: RuntimeConfig, split: str) -> torch.Tensor:
    """Logits of PROMPT's last position, run through the split."""
    local = await load_local(runtime, split)
    try:
        hidden = await local.compute.run(local.entry.embed, PROMPT)
        for shard in local.pipeline.shards:
            hidden = await local.compute.run(shard.forward, SessionId("logits"), hidden, 0)
        return await local.compute.run(local.entry.logits, hidden)
    finally:
        local.compute.close()


@pytest.mark.parametrize(("family", "fmt"), family_formats())
async def test_family_matches_transformers_whole_split_and_int8(
    family: str,
    fmt: str,
    family_checkpoints: dict[tuple[str, str], Checkpoint],
    family_cache: Path,
) -> None:
    checkpoint = family_checkpoints[family, fmt]
    expected = checkpoint.expected
    assert len(expected) == NEW_TOKENS, "the reference stopped early; pick another prompt"
    if checkpoint.spec.window:
        assert len(PROMPT) + len(expected) > 4 * WINDOW
    runtime = runtime_for(checkpoint, family_cache)
    # logits too: greedy tokens cannot see what keeps the argmax (Gemma-2's logit soft-cap)
    logits = await swarm_logits(runtime, checkpoint.spec.split)
    torch.testing.assert_close(logits, checkpoint.logits, rtol=1e-4, atol=1e-4)
    assert await swarm_tokens(runtime, None) == expected
    assert await swarm_tokens(runtime, checkpoint.spec.split) == expected
    int8 = runtime_for(checkpoint, family_cache, "int8")
    int8_whole = await swarm_tokens(int8, None, INT8_TOKENS)
    assert len(int8_whole) >= INT8_TOKENS // 2
    assert await swarm_tokens(int8, checkpoint.spec.split, INT8_TOKENS) == int8_whole


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
async def test_a_batched_decode_past_the_window_equals_one_session_at_a_time(
    family: str, family_checkpoints: dict[tuple[str, str], Checkpoint], family_cache: Path
) -> None:
    """Within the window Mistral's lean block batches the sessions; past it, and always for
    Gemma-2's eager layers, they run one at a time with their masks. Either way each session
    gets what it would alone."""
    from swarm.runtime.execution.entry import EntryModel
    from swarm.runtime.execution.model import ModelContext
    from swarm.runtime.execution.shard import Shard
    from swarm.types import LayerSpan

    runtime = runtime_for(family_checkpoints[family, "hf"], family_cache)
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    span = LayerSpan(0, context.num_layers)
    batched, alone = Shard.load(context, span, runtime), Shard.load(context, span, runtime)
    prompts = {
        SessionId("past"): PROMPT,
        SessionId("past-too"): PROMPT[:30],
        SessionId("within"): PROMPT[:8],
        SessionId("within-too"): PROMPT[:10],
    }
    for session, prompt in prompts.items():
        batched.forward(session, entry.embed(prompt), 0)
        alone.forward(session, entry.embed(prompt), 0)
    steps = [(s, entry.embed([7]), len(p)) for s, p in prompts.items()]
    results = batched.decode_batch(steps[:2], span) + batched.decode_batch(steps[2:], span)
    for (session, hidden, position), result in zip(steps, results, strict=True):
        assert isinstance(result, torch.Tensor)
        torch.testing.assert_close(result, alone.forward(session, hidden, position))
