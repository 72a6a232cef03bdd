from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any

import pytest

from harness.factories import write_tiny_llama
from harness.family_models import Checkpoint, build_checkpoints
from harness.gguf_fixture import LLAMA_TINY, fixture_path
from harness.paths import FIXTURES, MODEL_CACHE
from swarm.config import RuntimeConfig
from swarm.exits import quiet_triton_teardown


def pytest_configure(config: pytest.Config) -> None:
    """Triton's false leak report at shutdown would only bury the run's report: muted at
    exit, after pytest has given stderr back (its capture restores it after every hook)."""
    atexit.register(quiet_triton_teardown)


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
def smol_packed() -> RuntimeConfig:
    """The embedded model as users run it: its GGUF blocks on swarm's kernels, where a
    prefill rounds differently from decode rows (what exactness after a failover rests on)."""
    return RuntimeConfig(cache_dir=MODEL_CACHE, threads=1)


@pytest.fixture(scope="session")
def tiny_gguf() -> Path:
    """A seeded random Llama GGUF in a Q4_K_M-like mix, a few layers (cached)."""
    return fixture_path(LLAMA_TINY, FIXTURES)


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
