"""Kept prompt blocks across a restart: the file a node writes as it stops reads back as the
same blocks, a file made for another model, span, dtype or version is refused by name, a
torn or corrupt one is refused as such and deleted, and the node keeps going without it; the
entry's record of what it sent through each hop round-trips too."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from swarm.config import RuntimeConfig
from swarm.inference.prompt_keys import HopKey, KeptBlocks
from swarm.runtime.execution.kept_prompts import identity, read_kept, write_kept
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.prefix_blocks import PrefixBlock
from swarm.runtime.prefix_file import BlocksIdentity, PrefixFileError, load, save
from swarm.types import LayerSpan, NodeId

ID = BlocksIdentity("model-a", (0, 2), "float32", 2, 4, "1.0")


def _block(seed: int, dtype: torch.dtype = torch.float32, layers: int = 2) -> PrefixBlock:
    g = torch.Generator().manual_seed(seed)
    keys = tuple(torch.randn(1, 2, 3, 4, generator=g).to(dtype) for _ in range(layers))
    values = tuple(torch.randn(1, 2, 3, 4, generator=g).to(dtype) for _ in range(layers))
    return PrefixBlock(keys, values)


def _same(a: PrefixBlock, b: PrefixBlock) -> bool:
    return all(
        torch.equal(x, y) for x, y in zip((*a.keys, *a.values), (*b.keys, *b.values), strict=True)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_read_back_as_written_and_a_limit_keeps_the_most_recent(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    kind = dataclasses.replace(ID, dtype=str(dtype).removeprefix("torch."))
    blocks = [
        (("d" * 32, LayerSpan(0, 2)), _block(1, dtype)),
        (("e" * 32, LayerSpan(0, 1)), _block(2, dtype, 1)),
    ]
    path = tmp_path / kind.file_name()
    assert save(path, kind, blocks, limit_bytes=1 << 20) == 2
    back = load(path, kind, dtype)
    assert [k for k, _ in back] == [k for k, _ in blocks]
    assert all(_same(a, b) for (_, a), (_, b) in zip(back, blocks, strict=True))
    assert save(path, kind, blocks, limit_bytes=blocks[0][1].nbytes) == 1
    assert len(load(path, kind, dtype)) == 1


@pytest.mark.parametrize(
    ("other", "named"),
    [
        (dataclasses.replace(ID, model_id="model-b"), "model_id"),
        (dataclasses.replace(ID, span=(0, 3)), "span"),
        (dataclasses.replace(ID, dtype="bfloat16"), "dtype"),
        (dataclasses.replace(ID, swarm_version="2.0"), "swarm_version"),
    ],
)
def test_a_file_made_for_something_else_is_refused_by_name(
    tmp_path: Path, other: BlocksIdentity, named: str
) -> None:
    path = tmp_path / "blocks.bin"
    save(path, other, [(("d" * 32, LayerSpan(0, 2)), _block(1))], 1 << 20)
    with pytest.raises(PrefixFileError, match=f"made for another {named}"):
        load(path, ID, torch.float32)


def test_a_torn_or_corrupt_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "blocks.bin"
    save(path, ID, [(("d" * 32, LayerSpan(0, 2)), _block(1))], 1 << 20)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(PrefixFileError, match="torn or corrupt"):
        load(path, ID, torch.float32)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 1
    path.write_bytes(bytes(flipped))
    with pytest.raises(PrefixFileError, match="torn or corrupt"):
        load(path, ID, torch.float32)
    path.write_bytes(b"")
    with pytest.raises(PrefixFileError):
        load(path, ID, torch.float32)


def test_a_shard_reads_back_its_own_blocks_and_deletes_a_bad_file(
    tiny_runtime: RuntimeConfig, tmp_path: Path
) -> None:
    context = ModelContext.open(tiny_runtime, progress=False)
    shard = Shard.load(context, LayerSpan(0, 2), tiny_runtime)
    block = shard.kv.shape
    kept = PrefixBlock(
        tuple(torch.ones(1, block.kv_heads, 4, block.head_dim) for _ in range(2)),
        tuple(torch.zeros(1, block.kv_heads, 4, block.head_dim) for _ in range(2)),
    )
    shard.kv.prefixes.put(("a" * 32, LayerSpan(0, 2)), kept)
    assert write_kept(context, shard, tmp_path, 1 << 20) == 1
    again = Shard.load(context, LayerSpan(0, 2), tiny_runtime)
    assert read_kept(context, again, tmp_path) == 1
    assert again.kv.prefixes.held(["a" * 32], LayerSpan(0, 2)) == 1
    # another span's shard finds no file of its own; a corrupt one is deleted, not read
    other = Shard.load(context, LayerSpan(2, 4), tiny_runtime)
    assert read_kept(context, other, tmp_path) == 0
    path = tmp_path / identity(context, again).file_name()
    path.write_bytes(path.read_bytes()[:-1])
    third = Shard.load(context, LayerSpan(0, 2), tiny_runtime)
    assert read_kept(context, third, tmp_path) == 0 and not path.exists()
    # a folder that cannot be written loses the blocks, nothing else
    (tmp_path / "file").write_text("")
    assert write_kept(context, shard, tmp_path / "file", 1 << 20) == 0


def test_the_entry_record_round_trips_and_a_bad_one_does_not_read(tmp_path: Path) -> None:
    kept = KeptBlocks()
    hop = HopKey(NodeId("a"), LayerSpan(0, 10))
    kept.sent([hop], ["x", "y"])
    path = tmp_path / "sent-blocks.json"
    kept.save(path)
    assert KeptBlocks.read(path).held([hop], ["x", "y", "z"]) == 2
    assert KeptBlocks.read(tmp_path / "none.json").held([hop], ["x"]) == 0
    path.write_text(json.dumps({"format": 2, "hops": []}))
    with pytest.raises(ValueError, match="format"):
        KeptBlocks.read(path)
    path.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        KeptBlocks.read(path)
