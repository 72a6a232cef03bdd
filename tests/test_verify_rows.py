"""A verify step (several consecutive positions of one session in one step) gives every
position the bits that one-position decode steps give it, on every family and weight mode the
exact-match tests run, so greedy text cannot change with speculation. A plain multi-row
forward is not such a step: on torch's float products it rounds differently (checked below,
so the premise stays visible)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.family_models import PROMPT, SPECS, Checkpoint
from swarm.config import RuntimeConfig
from swarm.inference.local import load_local
from swarm.runtime.execution.shard import Shard
from swarm.runtime.kv_cache import KVShape, SessionKV
from swarm.types import SessionId
from tests.test_families import runtime_for

ROWS = 5  # the last accepted token and four drafted ones
DRAFT = [7, 30, 11, 54, 9]


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
