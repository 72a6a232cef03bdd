"""What a loaded span and the entry pieces hold, tensor by tensor: the packed bytes of their
parts (1.00x for the block kernels and Q4_1's 4-bit groups), never a dequantized or
float copy of a matrix, nor the bytes the store read them from."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from swarm.config import RuntimeConfig
from swarm.runtime.execution.entry import EntryModel
from swarm.runtime.execution.model import ModelContext
from swarm.runtime.execution.positions import Rotary
from swarm.runtime.execution.shard import Shard
from swarm.transfer.supply import probe_speed
from swarm.types import LayerSpan

BOUND = 1.15  # of the parts' packed bytes


def held(root: object, skip: tuple[type, ...]) -> dict[int, torch.Tensor]:
    """Every tensor reachable from `root` through attributes, containers and modules, by
    storage (views of one storage count once); objects of the `skip` types are not entered."""
    out: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    todo: list[Any] = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            out.setdefault(obj.untyped_storage().data_ptr(), obj)
        elif isinstance(obj, dict):
            todo += obj.values()
        elif isinstance(obj, list | tuple | set | frozenset):
            todo += obj
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            todo += vars(obj).values()
        elif hasattr(obj, "__slots__"):
            todo += [getattr(obj, s) for s in obj.__slots__ if hasattr(obj, s)]
    return out


def _bytes(tensors: dict[int, torch.Tensor]) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors.values())


def _matrices(tensors: dict[int, torch.Tensor], cols: set[int]) -> Iterator[torch.Tensor]:
    """Float tensors shaped like a whole matrix (a dequantized copy would be one)."""
    for t in tensors.values():
        if t.is_floating_point() and t.dim() == 2 and t.shape[1] in cols and t.shape[0] > 64:
            yield t


def test_a_span_holds_its_packed_bytes_and_no_float_copy(tiny_gguf: Path, tmp_path: Path) -> None:
    runtime = RuntimeConfig(model=str(tiny_gguf), cache_dir=tmp_path, dtype="packed", threads=1)
    context = ModelContext.open(runtime, progress=False)
    store = context.store
    span = LayerSpan(1, context.num_layers)
    shard = Shard.load(context, span, runtime)
    # the context is shared by every shard and the entry; the rotary tables are per shard,
    # sized by the context length, not the weights
    tensors = held(shard, (ModelContext, Rotary))
    packed = sum(store.part_bytes(f"layer-{i:04d}") for i in span)
    assert packed <= _bytes(tensors) <= BOUND * packed
    config = context.config
    assert not list(_matrices(tensors, {config.hidden_size, config.intermediate_size}))


def test_the_entry_holds_the_embedding_and_head_packed(tiny_gguf: Path, tmp_path: Path) -> None:
    runtime = RuntimeConfig(model=str(tiny_gguf), cache_dir=tmp_path, dtype="packed", threads=1)
    context = ModelContext.open(runtime, progress=False)
    entry = EntryModel(context)
    entry.logits(entry.embed(entry.encode_text("hello")))
    tensors = held(entry, (ModelContext,))
    packed = context.store.part_bytes("embed") + context.store.part_bytes("head")
    assert packed <= _bytes(tensors) <= BOUND * packed
    assert not list(_matrices(tensors, {context.hidden_size}))


def test_the_speed_probe_keeps_none_of_its_layers(tiny_gguf: Path, tmp_path: Path) -> None:
    runtime = RuntimeConfig(model=str(tiny_gguf), cache_dir=tmp_path, dtype="packed", threads=1)
    context = ModelContext.open(runtime, progress=False)
    speed = probe_speed(context, runtime)
    assert speed.prefill_ms > 0 and speed.decode.pace_ms > 0
    assert not [o for o in gc.get_objects() if type(o) is Shard]
    # and the store kept none of the probed layers it had not stored before
    assert not [p for p in context.store.stored_parts() if p.startswith("layer-")]
