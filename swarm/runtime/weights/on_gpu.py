"""Packed matrices on a CUDA device: the Triton kernels of `swarm.runtime.gpu` on the blocks
as stored, for every type they run; any other type is dequantized to float16 once, at load
(`load_note` names those tensors and what they cost)."""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from swarm.runtime.gpu import matrix as gpu
from swarm.runtime.weights import dequant, dequant_grid, ggml


def runs_triton(device: torch.device) -> bool:
    """Whether packed matrices on `device` run on the Triton kernels."""
    return device.type == "cuda" and gpu.available()


@functools.cache
def _values(device: torch.device) -> torch.Tensor:
    # the kernels' one value table: IQ4_NL's and IQ4_XS's 16 values, then MXFP4's
    return torch.cat([dequant_grid.iq4_values(device), dequant_grid.mxfp4_values(device)])


def triton_matrix(qtype: str, data: torch.Tensor, cols: int) -> gpu.TritonBlockMatrix:
    """data: uint8 [rows, row bytes] on the device the kernels run on."""
    kind = ggml.BLOCKS[qtype]
    layout = gpu.BlockLayout(qtype, kind.elements, kind.nbytes)
    return gpu.TritonBlockMatrix(layout, data, cols, _values(data.device))


class HalfMatrix:
    """A matrix of a type without a GPU kernel, dequantized once to float16."""

    def __init__(self, qtype: str, data: torch.Tensor, cols: int) -> None:
        self.weight = dequant.dequantize(qtype, data, cols, torch.float16)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.weight.shape[0]), int(self.weight.shape[1]))

    @property
    def nbytes(self) -> int:
        return int(self.weight.nbytes)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)


def gpu_matrix(qtype: str, data: torch.Tensor, cols: int) -> gpu.TritonBlockMatrix | HalfMatrix:
    if qtype in gpu.KERNEL_TYPES:
        return triton_matrix(qtype, data, cols)
    return HalfMatrix(qtype, data, cols)


def load_note(tensors: Mapping[str, object], device: torch.device) -> str | None:
    """One line naming the packed tensors that `device` will hold as float16 instead of their
    blocks, and the bytes that costs; None when there are none."""
    if not runs_triton(device):
        return None
    from swarm.runtime.weights.packed import PackedTensor  # packed builds its matrices here

    slow = {
        name: t
        for name, t in tensors.items()
        if isinstance(t, PackedTensor) and t.qtype not in gpu.KERNEL_TYPES
    }
    if not slow:
        return None
    stored = sum(t.nbytes for t in slow.values())
    half = sum(2 * t.shape[0] * t.shape[1] for t in slow.values())
    names = ", ".join(f"{name} ({t.qtype})" for name, t in slow.items())
    return (
        f"dequantized to float16 at load, no GPU kernel for their types: {names} "
        f"({stored / 2**20:.1f} MiB as stored, {half / 2**20:.1f} MiB as float16)"
    )
