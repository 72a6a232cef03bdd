"""A GGUF file's experts: llama.cpp writes each layer's experts of one projection as one 3-D
tensor (`blk.N.ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`: [experts, rows, cols] in
Hugging Face order). The store keeps each expert as its own 2-D matrix, its rows' blocks cut
out as they are (a 3-D block tensor is [experts * rows, row_bytes], so an expert's matrix is
a run of its rows); a part's key for one expert is "<tensor name>@<expert>"."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import torch

from swarm.errors import CorruptModelError, UnsupportedModelError
from swarm.runtime.checkpoint.gguf_file import GGUFTable, TensorInfo
from swarm.runtime.families.moe import expert_name
from swarm.runtime.weights import ggml

_EXPERTS = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.(weight|bias)")
_SEPARATOR = "@"


# llama.cpp's first Mixtral files (before the 3-D tensors): one 2-D tensor per expert
_ONE_EXPERT = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight")
_FUSED = re.compile(r"blk\.\d+\.ffn_gate_up_exps\.(weight|bias)")


def is_experts(name: str) -> bool:
    return any(p.fullmatch(name) for p in (_EXPERTS, _ONE_EXPERT, _FUSED))


def entries(tensor: TensorInfo, layers: str) -> Iterator[tuple[str, str, tuple[int, ...], int]]:
    """(Hugging Face name, part key, shape, bytes) of each expert in `tensor` (weights
    [experts, rows, cols], biases [experts, rows]; or one expert's 2-D tensor); `layers` is
    the family's path of its decoder layers."""
    one = _ONE_EXPERT.fullmatch(tensor.name)
    if one is not None:  # stored whole: its key is the tensor's own name
        name = expert_name(int(one[3]), one[2])
        yield f"{layers}.{one[1]}.{name}", tensor.name, tuple(reversed(tensor.shape)), tensor.nbytes
        return
    if _FUSED.fullmatch(tensor.name):
        raise UnsupportedModelError(
            f"{tensor.name}: experts with gate and up fused in one tensor are not supported "
            "yet; swarm reads ffn_gate_exps and ffn_up_exps apart"
        )
    found = _EXPERTS.fullmatch(tensor.name)
    dims = 3 if found is not None and found[3] == "weight" else 2
    if found is None or len(tensor.shape) != dims:
        raise CorruptModelError(
            f"{tensor.name} has shape {list(reversed(tensor.shape))}, not one "
            f"{'matrix' if dims == 3 else 'vector'} per expert"
        )
    experts, *shape = reversed(tensor.shape)
    name = expert_name(0, found[2]).removesuffix(".weight").removeprefix("mlp.experts.0.")
    for e in range(experts):
        yield (
            f"{layers}.{found[1]}.mlp.experts.{e}.{name}.{found[3]}",
            f"{tensor.name}{_SEPARATOR}{e}",
            tuple(shape),
            tensor.nbytes // experts,
        )


class Slicer:
    """One part's expert matrices out of the file: each 3-D tensor read once, then cut."""

    def __init__(self, table: GGUFTable) -> None:
        self.table = table
        self._read: dict[str, np.ndarray] = {}

    @staticmethod
    def owns(key: str) -> bool:
        return _SEPARATOR in key

    def slice(self, key: str) -> torch.Tensor:
        """An expert's floats [rows, cols] (a bias: [rows]), or its blocks [rows, row_bytes]."""
        name, _, expert = key.partition(_SEPARATOR)
        info = self.table.tensors.get(name)
        if info is None:
            raise CorruptModelError(f"{self.table.path}: tensor {name} is gone; the file changed")
        if name not in self._read:
            self._read[name] = self.table.read(name)
        raw = self._read[name]
        if info.qtype not in ggml.FLOAT_TYPES:  # [experts * rows, row_bytes]
            raw = raw.reshape(info.shape[-1], -1, raw.shape[-1])
        tensor = torch.from_numpy(np.ascontiguousarray(raw[int(expert)]).copy())
        return tensor.view(torch.int16).view(torch.bfloat16) if info.qtype == "BF16" else tensor
