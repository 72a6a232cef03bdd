from __future__ import annotations

from typing import Any

import pytest
import torch

from swarm.config import RuntimeConfig
from swarm.errors import ActivationError, PositionMismatchError, SessionNotFoundError, SpanError
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.families import generic, llama
from swarm.types import LayerSpan, SessionId

S = SessionId("s1")
PROMPT = [1, 17, 42, 99, 5, 250, 7, 8, 64, 3]


def _hf_reference(model: Any, ids: list[int], decode: list[int]) -> torch.Tensor:
    """Final hidden states (after the norm) of prompt + decode tokens, run with a cache."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        out = [model.model(torch.tensor([ids]), cache=cache, use_cache=True).last_hidden_state]
        for token in decode:
            out.append(
                model.model(torch.tensor([[token]]), cache=cache, use_cache=True).last_hidden_state
            )
    return torch.cat(out, dim=1)


def _run(entry: EntryModel, shards: list[Shard], ids: list[int], decode: list[int]) -> torch.Tensor:
    outs = []
    position = 0
    for chunk in [ids, *[[t] for t in decode]]:
        hidden = entry.embed(chunk)
        for shard in shards:
            hidden = shard.forward(S, hidden, position)
        position += len(chunk)
        outs.append(entry._norm(hidden))
    return torch.cat(outs, dim=1)


@pytest.fixture
def context(tiny_runtime: RuntimeConfig) -> ModelContext:
    return ModelContext.open(tiny_runtime, progress=False)


def test_whole_and_split_shards_match_transformers(
    context: ModelContext, tiny_runtime: RuntimeConfig, tiny_model: Any
) -> None:
    entry = EntryModel(context)
    decode = [11, 12, 13, 14]
    expected = _hf_reference(tiny_model, PROMPT, decode)
    whole = _run(entry, [Shard.load(context, LayerSpan(0, 4), tiny_runtime)], PROMPT, decode)
    split = _run(
        entry,
        [Shard.load(context, LayerSpan(a, b), tiny_runtime) for a, b in ((0, 1), (1, 3), (3, 4))],
        PROMPT,
        decode,
    )
    torch.testing.assert_close(whole, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(whole, split)


def test_lean_llama_block_is_bit_identical_to_the_hf_layer(
    context: ModelContext, tiny_runtime: RuntimeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = EntryModel(context)
    lean_shard = Shard.load(context, LayerSpan(0, 4), tiny_runtime)
    monkeypatch.setattr(llama, "supports", lambda config: False)
    hf_shard = Shard.load(context, LayerSpan(0, 4), tiny_runtime)
    assert any(isinstance(b, generic.HFBlock) for b in hf_shard._blocks)
    lean = _run(entry, [lean_shard], PROMPT, [4, 5, 6])
    hf = _run(entry, [hf_shard], PROMPT, [4, 5, 6])
    assert torch.equal(lean, hf)


def test_replay_rewinds_the_cache(context: ModelContext, tiny_runtime: RuntimeConfig) -> None:
    entry = EntryModel(context)
    shard = Shard.load(context, LayerSpan(0, 4), tiny_runtime)
    shard.forward(S, entry.embed(PROMPT), 0)
    shard.forward(S, entry.embed([50]), len(PROMPT))
    replayed = shard.forward(S, entry.embed([60]), len(PROMPT))  # the same position again
    fresh = Shard.load(context, LayerSpan(0, 4), tiny_runtime)
    fresh.forward(S, entry.embed(PROMPT), 0)
    assert torch.equal(replayed, fresh.forward(S, entry.embed([60]), len(PROMPT)))
    assert shard.kv.get(S).length == len(PROMPT) + 1


def test_chunked_prefill_matches_one_prefill(
    context: ModelContext, tiny_runtime: RuntimeConfig
) -> None:
    entry = EntryModel(context)
    one = Shard.load(context, LayerSpan(0, 4), tiny_runtime).forward(S, entry.embed(PROMPT), 0)
    chunked = Shard.load(context, LayerSpan(0, 4), tiny_runtime)
    first = chunked.forward(S, entry.embed(PROMPT[:4]), 0)
    rest = chunked.forward(S, entry.embed(PROMPT[4:]), 4)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), one, rtol=1e-5, atol=1e-5)


def test_sessions_are_independent_and_close_frees_them(
    context: ModelContext, tiny_runtime: RuntimeConfig
) -> None:
    entry = EntryModel(context)
    shard = Shard.load(context, LayerSpan(1, 3), tiny_runtime)
    a = shard.forward(SessionId("a"), entry.embed(PROMPT), 0)
    shard.forward(SessionId("b"), entry.embed([9, 9, 9]), 0)
    again = Shard.load(context, LayerSpan(1, 3), tiny_runtime).forward(
        SessionId("a"), entry.embed(PROMPT), 0
    )
    assert torch.equal(a, again)
    assert shard.kv.used_bytes > 0
    assert shard.close_session(SessionId("a")) and shard.close_session(SessionId("b"))
    assert shard.kv.used_bytes == 0


def test_bad_steps_raise_typed_errors_and_change_nothing(
    context: ModelContext, tiny_runtime: RuntimeConfig
) -> None:
    entry = EntryModel(context)
    shard = Shard.load(context, LayerSpan(0, 2), tiny_runtime)
    shard.forward(S, entry.embed(PROMPT), 0)
    with pytest.raises(PositionMismatchError):
        shard.forward(S, entry.embed([1]), len(PROMPT) + 3)
    with pytest.raises(SessionNotFoundError):
        shard.forward(SessionId("new"), entry.embed([1]), 5)
    with pytest.raises(ActivationError, match="shape"):
        shard.forward(S, torch.zeros(1, 2, 63), len(PROMPT))
    with pytest.raises(ActivationError, match="floating"):
        shard.forward(S, torch.zeros(1, 2, 64, dtype=torch.long), len(PROMPT))
    assert shard.kv.get(S).length == len(PROMPT)
    assert shard.kv.sessions() == [S]


def test_span_outside_the_model(context: ModelContext, tiny_runtime: RuntimeConfig) -> None:
    with pytest.raises(SpanError, match="4 layers"):
        Shard.load(context, LayerSpan(2, 6), tiny_runtime)


def test_bfloat16_runs_close_to_float32(tiny_runtime: RuntimeConfig) -> None:
    import dataclasses

    ctx32 = ModelContext.open(tiny_runtime, progress=False)
    ctx16 = ModelContext.open(dataclasses.replace(tiny_runtime, dtype="bfloat16"), progress=False)
    out32 = Shard.load(ctx32, LayerSpan(0, 4), tiny_runtime).forward(
        S, EntryModel(ctx32).embed(PROMPT), 0
    )
    out16 = Shard.load(ctx16, LayerSpan(0, 4), tiny_runtime).forward(
        S, EntryModel(ctx16).embed(PROMPT), 0
    )
    assert out16.dtype == torch.bfloat16
    torch.testing.assert_close(out16.float(), out32, rtol=0.05, atol=0.05)


def test_a_hop_can_run_part_of_its_span(context: ModelContext, tiny_runtime: RuntimeConfig) -> None:
    entry = EntryModel(context)
    whole = Shard.load(context, LayerSpan(0, 4), tiny_runtime)
    expected = whole.forward(S, entry.embed(PROMPT), 0)
    first = Shard.load(context, LayerSpan(0, 2), tiny_runtime)
    wide = Shard.load(context, LayerSpan(0, 4), tiny_runtime)  # entered at layer 2
    hidden = first.forward(S, entry.embed(PROMPT), 0)
    assert torch.equal(wide.forward(S, hidden, 0, LayerSpan(2, 4)), expected)
    with pytest.raises(SpanError, match="runs layers 2:4"):
        wide.forward(S, hidden[:, :1], len(PROMPT), LayerSpan(0, 4))
    with pytest.raises(SpanError, match="not within"):
        first.forward(S, hidden[:, :1], len(PROMPT), LayerSpan(1, 3))
