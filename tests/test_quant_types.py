"""A GGUF file with every block type swarm runs, one per matrix (the embedding and the head
too), loads and runs in every dtype mode, and the packed kernels follow float32 of the same
blocks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.gguf_fixture import LLAMA_TINY, FixtureSpec, fixture_path, tensor_plan
from swarm.config import RuntimeConfig
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.shard import Shard
from swarm.runtime.weights import ggml
from swarm.types import LayerSpan, SessionId

_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


_LAYERS = 4  # 28 matrices: room for every type


def every_type_spec() -> FixtureSpec:
    names = [f"blk.{i}.{m}.weight" for i in range(_LAYERS) for m in _MATRICES]
    types = sorted(ggml.BLOCKS)
    assert len(names) >= len(types)
    mix = list(zip(names, types, strict=False))
    mix += [("token_embd.weight", "Q5_0"), ("output.weight", "IQ4_XS")]
    return dataclasses.replace(LLAMA_TINY, layers=_LAYERS, types=tuple(mix), seed=11)


@pytest.fixture(scope="module")
def every_type_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fixture_path(every_type_spec(), tmp_path_factory.mktemp("fixtures"))


@torch.inference_mode()
def test_every_type_runs_in_every_dtype(every_type_gguf: Path, tmp_path: Path) -> None:
    written = {qtype for _, _, qtype in tensor_plan(every_type_spec())}
    assert set(ggml.BLOCKS) <= written
    logits = {}
    for dtype in ("packed", "float32", "bfloat16", "int8"):
        runtime = RuntimeConfig(model=str(every_type_gguf), cache_dir=tmp_path, threads=1)
        runtime = dataclasses.replace(runtime, dtype=dtype)
        context = ModelContext.open(runtime, progress=False)
        entry = EntryModel(context)
        shard = Shard.load(context, LayerSpan(0, context.num_layers), runtime)
        hidden = shard.forward(SessionId("s"), entry.embed(entry.encode_text("one two three")), 0)
        logits[dtype] = entry.logits(hidden).float()
    want = logits["float32"]
    assert torch.isfinite(want).all()
    for dtype, bound in (("packed", 0.03), ("int8", 0.05), ("bfloat16", 0.05)):
        diff = (logits[dtype] - want).abs().max()
        assert diff < bound * want.abs().max(), (dtype, diff, want.abs().max())


@pytest.mark.parametrize("qtype", ["Q5_0", "IQ1_M"])  # IQ1_M: its scale in four nibbles
def test_a_scale_that_is_not_finite_is_refused_by_name_and_nothing_is_stored(
    qtype: str, tmp_path: Path
) -> None:
    from harness.block_bytes import set_scale
    from swarm.errors import CorruptModelError
    from swarm.runtime.checkpoint.gguf_file import read_table
    from swarm.runtime.checkpoint.store import ModelStore

    name = "blk.1.ffn_up.weight"
    spec = dataclasses.replace(LLAMA_TINY, types=((name, qtype),))
    model = tmp_path / "bad.gguf"
    model.write_bytes(fixture_path(spec, tmp_path / "fixtures").read_bytes())
    info = read_table(model).tensors[name]
    kind = ggml.BLOCKS[qtype]
    data = bytearray(model.read_bytes())
    block = np.frombuffer(data, np.uint8, kind.nbytes, info.offset + 7 * kind.nbytes).copy()
    block = block.reshape(1, -1)
    set_scale(block, qtype, 0, float("nan"))
    data[info.offset + 7 * kind.nbytes : info.offset + 8 * kind.nbytes] = block.tobytes()
    model.write_bytes(bytes(data))
    store = ModelStore.open(str(model), tmp_path / "cache", progress=False)
    with pytest.raises(CorruptModelError) as failure:
        store.load_layer(1)
    message = str(failure.value)
    assert name in message and qtype in message and "block 7" in message and "\n" not in message
    assert store.stored_parts() == []
    assert not [p for p in store.folder.iterdir() if p.name.startswith(".")]  # no temporary
    store.load_layer(0)  # the other layers still load
