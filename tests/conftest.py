from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from swarm.config import RuntimeConfig
from tests.factories import write_tiny_llama
from tests.family_models import Checkpoint, build_checkpoints
from tests.gguf_fixture import LLAMA_TINY, fixture_path

REPO = Path(__file__).resolve().parent.parent
# Converting the real model takes ~20 s; keep the cache between runs unless told otherwise.
MODEL_CACHE = Path(os.environ.get("SWARM_TEST_CACHE", REPO / ".cache" / "models"))


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    write_tiny_llama(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model(tiny_folder: Path) -> Any:
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(tiny_folder, attn_implementation="sdpa").eval()


@pytest.fixture
def tiny_runtime(tiny_folder: Path, tmp_path: Path) -> RuntimeConfig:
    return RuntimeConfig(model=str(tiny_folder), cache_dir=tmp_path / "cache", threads=1)


@pytest.fixture(scope="session")
def smol_runtime() -> RuntimeConfig:
    """The embedded model in float32: what transformers computes, for exact comparisons."""
    return RuntimeConfig(cache_dir=MODEL_CACHE, dtype="float32")


@pytest.fixture(scope="session")
def tiny_gguf() -> Path:
    """A seeded random Llama GGUF in a Q4_K_M-like mix, a few layers (cached)."""
    return fixture_path(LLAMA_TINY, MODEL_CACHE.parent / "fixtures")


@pytest.fixture(scope="session")
def family_checkpoints(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, str], Checkpoint]:
    """Every family's tiny model as a HF folder and as GGUF, built once per test session."""
    return build_checkpoints(tmp_path_factory.mktemp("families"))


@pytest.fixture(scope="session")
def family_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store cache for the family tests: each checkpoint is converted once."""
    return tmp_path_factory.mktemp("family-cache")
