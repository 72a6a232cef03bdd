"""The families' tiny models run in this process, as the family, speculation and kernel tests
run them: a runtime for a checkpoint, greedy tokens whole or through a split, and sessions'
decode or verify steps after their prefills."""

from __future__ import annotations

from pathlib import Path

from harness.family_models import NEW_TOKENS, PROMPT, Checkpoint
from swarm.config import DType, RuntimeConfig
from swarm.inference.generation import Chunk, generate
from swarm.inference.local import load_local
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.shard import DecodeStep, Shard
from swarm.sampling_settings import SamplingSettings
from swarm.types import SessionId

DRAFT = [7, 30, 11, 54, 9]  # a verify step's tokens: the last accepted one and four drafted


def runtime_for(checkpoint: Checkpoint, cache: Path, dtype: DType = "float32") -> RuntimeConfig:
    return RuntimeConfig(model=str(checkpoint.path), cache_dir=cache, threads=1, dtype=dtype)


async def swarm_tokens(
    runtime: RuntimeConfig, split: str | None, new_tokens: int = NEW_TOKENS
) -> list[int]:
    """Greedy tokens after PROMPT, whole (`split` None) or through the split."""
    local = await load_local(runtime, split)
    try:
        tokens: list[int] = []
        params = SamplingSettings(max_tokens=new_tokens)
        async for event in generate(local.entry, local.pipeline, local.compute, PROMPT, params):
            if isinstance(event, Chunk) and event.token_id is not None:
                tokens.append(event.token_id)
        return tokens
    finally:
        local.compute.close()


def steps_after_prefill(
    shard: Shard, entry: EntryModel, batch: list[tuple[int, int]]
) -> list[DecodeStep]:
    """Per (prompt length, rows) of `batch`: a session's prefill of that much of PROMPT on
    `shard`, and its step after it, of that many rows of DRAFT (one: a decode step; more: a
    verify step)."""
    steps: list[DecodeStep] = []
    for i, (prompt, rows) in enumerate(batch):
        session = SessionId(f"s{i}")
        shard.forward(session, entry.embed(PROMPT[:prompt]), 0)
        steps.append((session, entry.embed(DRAFT[:rows]), prompt))
    return steps
