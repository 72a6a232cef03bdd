"""Every supported family, from a Hugging Face folder and from GGUF: greedy tokens equal
transformers' own `generate` on the same weights, whole and split three ways, for a session
longer than four sliding windows; int8 weights split equal int8 weights whole."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from swarm.config import RuntimeConfig
from swarm.inference.generation import Chunk, generate
from swarm.inference.local import load_local
from swarm.runtime.sampling import SamplingParams
from swarm.types import SessionId
from tests.family_models import SPECS, WINDOW, FamilySpec, build_model, write_folder, write_gguf

PROMPT = [1, *range(10, 49)]  # 40 positions: the prefill alone crosses the sliding window
NEW_TOKENS = 28  # 68 positions in all: more than four sliding windows
INT8_TOKENS = 12
FORMATS = ("hf", "gguf")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    spec: FamilySpec
    path: Path  # the HF folder or the .gguf file
    expected: list[int]  # transformers' greedy tokens after PROMPT
    logits: torch.Tensor  # transformers' logits [vocab] for the last position of PROMPT


def gguf_spec(spec: FamilySpec) -> FamilySpec:
    """A Mistral GGUF is a llama-architecture file, which carries no sliding window: the
    GGUF checkpoint of Mistral is a window-less Mistral (as v0.2 and later are)."""
    if spec.name != "mistral":
        return spec
    return dataclasses.replace(
        spec, window=None, overrides={**spec.overrides, "sliding_window": None}
    )


def reference_tokens(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False
        )
    eos = model.generation_config.eos_token_id
    return [t for t in out[0, len(prompt) :].tolist() if t != eos]


def reference(model: Any, spec: FamilySpec, path: Path) -> Checkpoint:
    with torch.inference_mode():
        logits = model(torch.tensor([PROMPT])).logits[0, -1].float()
    return Checkpoint(spec, path, reference_tokens(model, PROMPT, NEW_TOKENS), logits)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Checkpoint]:
    """Each family's tiny model in both formats, built once per test session."""
    root = tmp_path_factory.mktemp("families")
    built: dict[tuple[str, str], Checkpoint] = {}
    for name, spec in SPECS.items():
        model = build_model(spec)
        built[name, "hf"] = reference(model, spec, write_folder(model, root / name / "hf"))
        used = gguf_spec(spec)
        if used is spec:
            path = write_gguf(model, used, root / name / f"{name}.gguf")
            built[name, "gguf"] = dataclasses.replace(built[name, "hf"], path=path)
        else:
            model = build_model(used)
            built[name, "gguf"] = reference(
                model, used, write_gguf(model, used, root / name / f"{name}.gguf")
            )
    return built


@pytest.fixture(scope="session")
def family_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("family-cache")


def runtime_for(checkpoint: Checkpoint, cache: Path, dtype: str = "float32") -> RuntimeConfig:
    return RuntimeConfig(model=str(checkpoint.path), cache_dir=cache, threads=1, dtype=dtype)


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


async def swarm_tokens(
    runtime: RuntimeConfig, split: str | None, new_tokens: int = NEW_TOKENS
) -> list[int]:
    local = await load_local(runtime, split)
    try:
        tokens = []
        params = SamplingParams(max_tokens=new_tokens)
        async for event in generate(local.entry, local.pipeline, local.compute, PROMPT, params):
            if isinstance(event, Chunk) and event.token_id is not None:
                tokens.append(event.token_id)
        return tokens
    finally:
        local.compute.close()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", sorted(SPECS))
async def test_family_matches_transformers_whole_split_and_int8(
    family: str, fmt: str, checkpoints: dict[tuple[str, str], Checkpoint], family_cache: Path
) -> None:
    checkpoint = checkpoints[family, fmt]
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
