"""The lean block (`llama.LlamaBlock`) beyond Llama: Qwen3's per-head q and k norms, and a
feed-forward that is not gate, up and down (the experts of Qwen3-MoE and Mixtral).

With float weights each layer gives the bits of transformers' own decoder layer (the same
layer with the same experts module, for a mixture of experts), past a sliding window too. On
swarm's kernels (the packed Qwen3-MoE fixture) the experts decide whether rows of several
sessions or positions may share a call: while they do not compute each row alone, batched
steps match one session at a time closely and prefill chunks keep their own bits; a
feed-forward that does makes batched decode and verify steps the bits of one-position steps."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.family_models import SPECS, WINDOW, FamilySpec, build_model, write_folder
from harness.moe_fixture import QWEN3_MOE_TINY, moe_fixture_path
from harness.paths import FIXTURES
from swarm.config import RuntimeConfig
from swarm.errors import ModelError
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.families import generic, llama, moe
from swarm.runtime.weights import native
from swarm.types import LayerSpan, SessionId

PROMPT = [1, *range(10, 20)]  # 11 positions: decode steps cross the window below
DECODE = [7, 30, 11, 54, 9, 21, 40, 3, 12]  # positions 11..19


def _variant(name: str, **overrides: Any) -> FamilySpec:
    spec = SPECS[name]
    return dataclasses.replace(spec, layers=2, overrides={**spec.overrides, **overrides})


VARIANTS = {
    "qwen3": _variant("qwen3"),
    "qwen3-biases": _variant("qwen3", attention_bias=True),
    "qwen3-sliding": _variant(
        "qwen3", use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
    ),
    "qwen3_moe": _variant("qwen3_moe"),
    "mixtral": _variant("mixtral"),
    "mixtral-sliding": _variant("mixtral", sliding_window=WINDOW),
    "mistral-sliding": _variant("mistral"),
}


def _run(shard: Shard, entry: EntryModel) -> torch.Tensor:
    """A prefill and decode steps, whose positions pass WINDOW."""
    outs = [shard.forward(SessionId("s"), entry.embed(PROMPT), 0)]
    for i, token in enumerate(DECODE):
        outs.append(shard.forward(SessionId("s"), entry.embed([token]), len(PROMPT) + i))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_float_layers_are_the_bits_of_transformers_layers(
    variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = VARIANTS[variant]
    folder = write_folder(build_model(spec), tmp_path / variant)
    assert len(PROMPT) + len(DECODE) > WINDOW
    runtime = RuntimeConfig(model=str(folder), cache_dir=tmp_path / "cache", threads=1)
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    span = LayerSpan(0, context.num_layers)
    lean_shard = Shard.load(context, span, runtime)
    assert all(isinstance(lean_shard.block(i), llama.LlamaBlock) for i in span)
    monkeypatch.setattr(llama, "supports", lambda config: False)
    monkeypatch.setattr(moe, "runs_lean", lambda config: False)
    hf_shard = Shard.load(context, span, runtime)
    assert all(isinstance(hf_shard.block(i), generic.HFBlock) for i in span)
    assert torch.equal(_run(lean_shard, entry), _run(hf_shard, entry))


@pytest.mark.skipif(not native.available(), reason="swarm's kernels are not built here")
@pytest.mark.parametrize("variant", ["qwen3", "qwen3_moe"])
def test_native_steps_follow_torch_steps_on_int8_weights(variant: str, tmp_path: Path) -> None:
    """q and k normed per head by the kernels' RMS norm, in place, before their rotation:
    what torch's steps compute, up to rounding."""
    folder = write_folder(build_model(VARIANTS[variant]), tmp_path / variant)
    runtime = RuntimeConfig(
        model=str(folder), cache_dir=tmp_path / "cache", threads=1, dtype="int8"
    )
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    span = LayerSpan(0, context.num_layers)
    kernels, torch_steps = Shard.load(context, span, runtime), Shard.load(context, span, runtime)
    for i in span:
        block = torch_steps.block(i)
        assert isinstance(block, llama.LlamaBlock) and block.qk_norms is not None
        assert block.native_steps and block.native_attention
        block.native_steps = block.native_attention = False
    # the int8 product rounds its activations to int16 per group: a rounding apart upstream
    # can move a value by ~1e-4 (a norm left out moves it by ~5)
    torch.testing.assert_close(_run(kernels, entry), _run(torch_steps, entry), rtol=1e-3, atol=1e-3)


def test_a_weight_the_block_would_not_use_is_refused(tmp_path: Path) -> None:
    spec = VARIANTS["qwen3"]
    folder = write_folder(build_model(spec), tmp_path / "qwen3")
    runtime = RuntimeConfig(model=str(folder), cache_dir=tmp_path / "cache", threads=1)
    context = ModelContext.open(runtime, progress=False)
    weights = context.to_runtime(context.store.load_layer(0))
    weights["self_attn.sinks"] = torch.zeros(4)
    with pytest.raises(ModelError, match=r"layer 0 .* \['self_attn.sinks'\]"):
        llama.LlamaBlock(context.config, 0, weights)


def _on_torch(shard: Shard) -> None:
    """The shard's experts on torch's path (routing from torch's float product)."""
    for i in shard.span:
        shard.block(i).experts.native = None  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def packed_moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelContext, RuntimeConfig]:
    path = moe_fixture_path(QWEN3_MOE_TINY, FIXTURES)
    runtime = RuntimeConfig(model=str(path), cache_dir=tmp_path_factory.mktemp("moe"), threads=1)
    return ModelContext.open(runtime, progress=False), runtime


def _sessions(
    shard: Shard, entry: EntryModel, name: str
) -> list[tuple[SessionId, torch.Tensor, int]]:
    """Three sessions' prefills, and each one's next decode step."""
    steps = []
    for i in range(3):
        session, prompt = SessionId(f"{name}{i}"), PROMPT[: 5 + 3 * i]
        shard.forward(session, entry.embed(prompt), 0)
        steps.append((session, entry.embed([40 + i]), len(prompt)))
    return steps


@pytest.mark.skipif(not native.available(), reason="swarm's kernels are not built here")
def test_packed_moe_batches_where_the_experts_compute_rows_alone(
    packed_moe: tuple[ModelContext, RuntimeConfig],
) -> None:
    context, runtime = packed_moe
    entry = EntryModel(context)
    span = LayerSpan(0, context.num_layers)
    batched, alone = Shard.load(context, span, runtime), Shard.load(context, span, runtime)
    blocks = [batched.block(i) for i in span]
    assert all(isinstance(b, moe.MoEBlock) and b.native_attention for b in blocks)
    # the experts in one kernel call: a batch is the bits of one session at a time
    steps = _sessions(batched, entry, "same")
    expected = [alone.forward(*step) for step in _sessions(alone, entry, "same")]
    cache = batched.kv.get(steps[0][0])
    assert all(b.decodes_rows_alone(cache) for b in blocks)  # type: ignore[attr-defined]
    for result, want in zip(batched.decode_batch(steps, span), expected, strict=True):
        assert isinstance(result, torch.Tensor) and torch.equal(result, want)
    # and a verify step of several positions is the bits of as many one-position steps
    session, _, position = steps[0]
    rows = entry.embed(DECODE[:4])
    verified = batched.verify(session, rows, position + 1)
    one_by_one = [alone.forward(session, rows[:, i : i + 1], position + 1 + i) for i in range(4)]
    assert torch.equal(verified, torch.cat(one_by_one, dim=1))

    # on torch's path the router weighs rows that come together: close, and said so
    _on_torch(batched)
    _on_torch(alone)
    steps = _sessions(batched, entry, "close")
    expected = [alone.forward(*step) for step in _sessions(alone, entry, "close")]
    assert not any(b.decodes_rows_alone(cache) for b in blocks)  # type: ignore[attr-defined]
    for result, want in zip(batched.decode_batch(steps, span), expected, strict=True):
        assert isinstance(result, torch.Tensor)
        torch.testing.assert_close(result, want, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not native.available(), reason="swarm's kernels are not built here")
@pytest.mark.parametrize("path", ["kernels", "torch"])
def test_packed_moe_prefill_chunks_keep_their_own_bits(
    path: str, packed_moe: tuple[ModelContext, RuntimeConfig]
) -> None:
    """Sessions' prefill chunks share the experts' call only where it computes each row
    alone (the kernels'); experts that weigh rows together run each session's chunk alone.
    Either way each session gets the bits it gets alone."""
    context, runtime = packed_moe
    entry = EntryModel(context)
    span = LayerSpan(0, context.num_layers)
    batched, alone = Shard.load(context, span, runtime), Shard.load(context, span, runtime)
    if path == "torch":
        _on_torch(batched)
        _on_torch(alone)
    steps = [(SessionId(f"p{i}"), entry.embed(PROMPT[: 4 + 2 * i]), 0) for i in range(3)]
    experts = batched.block(0).experts  # type: ignore[attr-defined]
    calls: list[int] = []  # the rows of each call
    hook = experts.register_forward_pre_hook(lambda _, args: calls.append(args[0].shape[1]))
    try:
        results = batched.prefill_batch(steps, span)
    finally:
        hook.remove()
    assert calls == ([18] if path == "kernels" else [4, 6, 8])
    for (session, hidden, position), result in zip(steps, results, strict=True):
        assert isinstance(result, torch.Tensor)
        assert torch.equal(result, alone.forward(session, hidden, position))
