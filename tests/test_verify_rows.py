"""A verify step (several consecutive positions of one session in one step) gives every
position the bits that one-position decode steps give it, on every family and weight mode the
exact-match tests run, so greedy text cannot change with speculation. A plain multi-row
forward is not such a step: on torch's float products it rounds differently (checked below,
so the premise stays visible). Verify steps share a call with other sessions' decode and
verify steps (`Shard.decode_rows`), and each row keeps the bits it has alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.family_models import PROMPT, SPECS, Checkpoint
from harness.family_runs import DRAFT, runtime_for, steps_after_prefill
from swarm.config import RuntimeConfig
from swarm.inference.local import load_local
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.kv_cache import KVShape, SessionKV
from swarm.runtime.weights import native
from swarm.types import LayerSpan, SessionId

ROWS = 5  # the last accepted token and four drafted ones


async def _outputs(runtime: RuntimeConfig, prompt: list[int]) -> tuple[list, list, list]:
    """Per shard of a three-way split: what one-row steps, a verify step and a plain
    multi-row forward return for ROWS positions after `prompt`."""
    local = await load_local(runtime, None)
    try:
        shard: Shard = local.pipeline.shards[0]
        entry = local.entry
        prefill = await local.compute.run(entry.embed, prompt)
        rows = await local.compute.run(entry.embed, DRAFT[:ROWS])
        at = len(prompt)
        results: dict[str, torch.Tensor] = {}
        for how in ("decode", "verify", "forward"):
            session = SessionId(how)
            await local.compute.run(shard.forward, session, prefill, 0)
            if how == "decode":
                outs = [
                    await local.compute.run(shard.forward, session, rows[:, i : i + 1], at + i)
                    for i in range(ROWS)
                ]
                results[how] = torch.cat(outs, dim=1)
            else:
                run = shard.verify if how == "verify" else shard.forward
                results[how] = await local.compute.run(run, session, rows, at)
            logits = [
                await local.compute.run(entry.logits, results[how][:, i : i + 1])
                for i in range(ROWS)
            ]
            results[how + "_logits"] = torch.stack(logits)
        # the head over all rows at once, as the entry samples a verify step
        results["rows"] = await local.compute.run(entry.row_logits, results["verify"])
        return (
            [results["decode"], results["decode_logits"], results["decode_logits"]],
            [results["verify"], results["verify_logits"], results["rows"]],
            [results["forward"], results["forward_logits"], results["forward_logits"]],
        )
    finally:
        local.compute.close()


def _same_bits(a: list, b: list) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("family", sorted(SPECS))
async def test_a_verify_step_equals_one_position_steps_on_every_family(
    family: str,
    dtype: str,
    family_checkpoints: dict[tuple[str, str], Checkpoint],
    family_cache: Path,
) -> None:
    runtime = runtime_for(family_checkpoints[family, "hf"], family_cache, dtype)
    decode, verify, _ = await _outputs(runtime, PROMPT[:12])
    assert decode[0].shape == (1, ROWS, decode[0].shape[2])
    assert _same_bits(decode, verify)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["packed", "float32", "int8"])
async def test_a_verify_step_equals_one_position_steps_on_the_embedded_model(
    dtype: str, smol_runtime: RuntimeConfig
) -> None:
    runtime = RuntimeConfig(cache_dir=smol_runtime.cache_dir, dtype=dtype, threads=1)  # type: ignore[arg-type]
    decode, verify, forward = await _outputs(runtime, [1, 504, 2364, 314, 3045, 30, 284])
    assert _same_bits(decode, verify)
    if dtype == "float32":  # the premise: torch's matrix-matrix products sum in another order
        assert not _same_bits(decode, forward)


def test_a_rewind_then_a_write_equals_never_writing_the_rejected_positions() -> None:
    shape = KVShape((0,), kv_heads=2, head_dim=4, dtype=torch.float32, device=torch.device("cpu"))
    keys = torch.randn(1, 2, 9, 4)
    values = torch.randn(1, 2, 9, 4)

    def write(kv: SessionKV, start: int, end: int, source: torch.Tensor = keys) -> None:
        kv.begin_step(start, end - start)
        kv.update(source[:, :, start:end], values[:, :, start:end], 0)
        kv.commit()

    straight = SessionKV(SessionId("straight"), shape)
    straight.resize(64)
    write(straight, 0, 4)
    write(straight, 4, 9)
    rewound = SessionKV(SessionId("rewound"), shape)
    rewound.resize(64)
    write(rewound, 0, 4)
    write(rewound, 4, 8, torch.randn(1, 2, 9, 4))  # drafted positions 4..7, then rejected
    write(rewound, 4, 9)  # the next step starts at the accepted length
    assert rewound.length == straight.length == 9
    rewound.begin_step(9, 0)
    straight.begin_step(9, 0)
    got = rewound.update(keys[:, :, :0], values[:, :, :0], 0)
    want = straight.update(keys[:, :, :0], values[:, :, :0], 0)
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1], want[1])


# One call's steps: (prompt length, rows) per session, a row a decode step, more a verify
# step of the last accepted token and its drafts. The windowed families see WINDOW positions.
BATCHES = {
    "decode and verify steps": [(8, 1), (5, 4), (12, 1), (3, 3)],
    "verify steps only": [(6, 5), (9, 2)],
    "a verify step past the window": [(8, 1), (30, 4), (10, 1)],
    "a decode step past the window": [(40, 1), (4, 3)],
}
# the families whose blocks run decode rows in one call (the lean block and its experts')
BATCHED = {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral"}


def _one_by_one(shard: Shard, session: SessionId, hidden: torch.Tensor, at: int) -> torch.Tensor:
    """What the step's positions give as one-position decode steps, one call each."""
    rows = [shard.forward(session, hidden[:, i : i + 1], at + i) for i in range(hidden.shape[1])]
    return torch.cat(rows, dim=1)


def _cache(shard: Shard, session: SessionId) -> list[torch.Tensor]:
    """Every key and value the session's cache holds, layer by layer."""
    kv, shape = shard.kv.get(session), shard.kv.shape
    kv.begin_step(kv.length, 0)
    with torch.inference_mode():  # the cache's tensors were made there
        empty = torch.empty(1, shape.kv_heads, 0, shape.head_dim, dtype=shape.dtype)
        return [t for layer in shape.layers for t in kv.update(empty, empty, layer)]


@pytest.mark.skipif(not native.available(), reason="swarm's kernels are not built for this CPU")
@pytest.mark.parametrize("case", sorted(BATCHES))
@pytest.mark.parametrize("family", sorted(SPECS))
def test_decode_and_verify_steps_in_one_call_give_each_row_the_bits_it_has_alone(
    family: str,
    case: str,
    family_checkpoints: dict[tuple[str, str], Checkpoint],
    family_cache: Path,
) -> None:
    """int8 runs every product on swarm's kernels: where the blocks batch and no window hides
    a key, every row of every step shares each layer's call; elsewhere the rows run one
    after the other. Either way each step gets, and leaves in its cache, the bits of running
    it alone as one-position decode steps (`forward`, once per position)."""
    runtime = runtime_for(family_checkpoints[family, "hf"], family_cache, "int8")
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    span = LayerSpan(0, context.num_layers)
    together, alone = Shard.load(context, span, runtime), Shard.load(context, span, runtime)
    batch = BATCHES[case]
    steps = steps_after_prefill(together, entry, batch)
    run = together.decode_rows(steps, span)
    alone_steps = steps_after_prefill(alone, entry, batch)
    for (session, hidden, position), got in zip(alone_steps, run.outputs, strict=True):
        assert isinstance(got, torch.Tensor)
        assert torch.equal(got, _one_by_one(alone, session, hidden, position)), session
        assert all(map(torch.equal, _cache(together, session), _cache(alone, session)))
    window = SPECS[family].window
    seen = all(window is None or prompt + rows <= window for prompt, rows in batch)
    assert run.shared == (family in BATCHED and seen)


def test_where_torch_sums_the_rows_a_verify_step_keeps_its_bits_beside_decode_steps(
    family_checkpoints: dict[tuple[str, str], Checkpoint], family_cache: Path
) -> None:
    """On torch's float products a batch of decode steps rounds as a batch (close to one
    step alone); a verify step's rows, whose logits must be decoding's bits, run one after the
    other beside it, each the bits of a one-position step alone."""
    runtime = runtime_for(family_checkpoints["llama", "hf"], family_cache, "float32")
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    span = LayerSpan(0, context.num_layers)
    together, alone = Shard.load(context, span, runtime), Shard.load(context, span, runtime)
    batch = BATCHES["decode and verify steps"]
    run = together.decode_rows(steps_after_prefill(together, entry, batch), span)
    assert not run.shared  # the verify rows ran apart: no pace sample of that many rows
    alone_steps = steps_after_prefill(alone, entry, batch)
    for (session, hidden, position), got in zip(alone_steps, run.outputs, strict=True):
        assert isinstance(got, torch.Tensor)
        if hidden.shape[1] == 1:
            torch.testing.assert_close(got, alone.forward(session, hidden, position))
        else:
            assert torch.equal(got, _one_by_one(alone, session, hidden, position))
