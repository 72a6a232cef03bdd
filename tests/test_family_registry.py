"""Which checkpoints load: a model type no family registers, or a feature its family does not
implement, is refused at load in one line naming the model type and what is supported; a
store written by another converter version is never reused; a base model asks for --raw."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from harness.factories import TINY_VOCAB, tiny_tokenizer, write_tiny_llama
from harness.family_models import SPECS, Checkpoint, family_config, write_gguf
from swarm import cli
from swarm.config import RuntimeConfig
from swarm.errors import UnsupportedModelError
from swarm.exits import WRONG_START
from swarm.runtime.checkpoint import store as store_module
from swarm.runtime.checkpoint.store import ModelStore
from swarm.runtime.families import REGISTERED, family_for


def _write(model: torch.nn.Module, folder: Path) -> Path:
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def _cli_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(args) == WRONG_START  # the model given cannot be used
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]  # after the conversion's progress bar, if any
    assert last.startswith("swarm: error: "), err
    return last


def test_every_family_module_is_registered_once() -> None:
    model_types = [t for f in REGISTERED for t in f.model_types]
    assert len(model_types) == len(set(model_types))
    for spec in SPECS.values():
        assert family_for(family_config(spec)).name == spec.name


def test_an_unsupported_family_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=TINY_VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
        bos_token_id=1,  # GPT-2's own ids lie outside the tiny vocabulary
        eos_token_id=2,
    )
    folder = _write(GPT2LMHeadModel(config), tmp_path / "gpt2")
    with pytest.raises(UnsupportedModelError, match="model type 'gpt2' is not supported"):
        ModelStore.open(str(folder), tmp_path / "cache", progress=False)
    err = _cli_error(
        ["generate", "--model", str(folder), "--cache-dir", str(tmp_path), "--prompt", "w1"],
        capsys,
    )
    assert "'gpt2' is not supported" in err and "llama" in err and "gemma3_text" in err


def test_an_unknown_rope_type_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "yarn"
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    write_tiny_llama(folder, rope_parameters=rope)
    err = _cli_error(
        ["generate", "--model", str(folder), "--cache-dir", str(tmp_path), "--prompt", "w1"],
        capsys,
    )
    assert "'llama'" in err and "'yarn'" in err and "llama3" in err
    gemma = family_config(SPECS["gemma3"])
    gemma.rope_parameters["full_attention"] = {"rope_type": "dynamic", "rope_theta": 1e6}
    with pytest.raises(UnsupportedModelError, match="'gemma3_text' with rope type 'dynamic'"):
        family_for(gemma)


def test_a_gguf_rope_scaling_transformers_would_drop_is_refused(
    family_checkpoints: dict[tuple[str, str], Checkpoint], tmp_path: Path
) -> None:
    llama = family_checkpoints["llama", "hf"]
    yarn = write_gguf(
        llama.model, llama.spec, tmp_path / "yarn.gguf", strings={"llama.rope.scaling.type": "yarn"}
    )
    with pytest.raises(UnsupportedModelError, match="GGUF rope scaling 'yarn' is not supported"):
        ModelStore.open(str(yarn), tmp_path / "cache", progress=False)
    phi3 = family_checkpoints["phi3", "hf"]
    factors = {"rope_factors_long.weight": np.ones(8, dtype=np.float32)}
    longrope = write_gguf(phi3.model, phi3.spec, tmp_path / "long.gguf", tensors=factors)
    with pytest.raises(UnsupportedModelError, match="'phi3' with long-context rope factors"):
        ModelStore.open(str(longrope), tmp_path / "cache", progress=False)


def test_a_store_of_another_converter_version_is_rebuilt(
    tiny_runtime: RuntimeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    current = ModelStore.open(tiny_runtime.model, tiny_runtime.cache_dir, progress=False)
    monkeypatch.setattr(store_module, "CONVERTER_VERSION", store_module.CONVERTER_VERSION + 1)
    newer = ModelStore.open(tiny_runtime.model, tiny_runtime.cache_dir, progress=False)
    assert newer.folder != current.folder  # converted again, not reused
    assert newer.manifest.parts.keys() == current.manifest.parts.keys()


def test_a_base_model_asks_for_raw(
    family_checkpoints: dict[tuple[str, str], Checkpoint],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    gguf = str(family_checkpoints["qwen2", "gguf"].path)  # no chat template in the file
    flags = ["--model", gguf, "--cache-dir", str(tmp_path), "--max-tokens", "3"]
    err = _cli_error(["generate", *flags, "--prompt", "ab cd"], capsys)
    assert "no chat template" in err and "--raw" in err
    assert cli.main(["generate", *flags, "--prompt", "ab cd", "--raw"]) == 0
    assert "3 generated" in capsys.readouterr().err
