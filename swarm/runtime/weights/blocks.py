"""Matrices multiplied straight from their GGUF blocks by swarm's block kernels
(kernels/blocks.c): every block type, kept as the file stores it (1.00x its bytes).

The kernel decodes a chunk of 256 weights at a time into exact int8 codes with float scales
(per 16 or 32 weights) and offsets, and multiplies it with activations rounded to int16 per
group of 32, as the 4-bit and int8 kernels round them: each product is the exact
dequantization's, up to that rounding and float32 sums. The IQ types' grids are the `gguf`
package's own tables (`dequant_grid.grid_int8`), shared by every matrix of a type."""

from __future__ import annotations

import functools

import torch

from swarm.runtime.weights import dequant_grid, native

_GRIDS = {  # IQ types that index a grid: the table the kernel reads
    "IQ2_XXS": "IQ2_XXS",
    "IQ2_XS": "IQ2_XS",
    "IQ2_S": "IQ2_S",
    "IQ3_XXS": "IQ3_XXS",
    "IQ3_S": "IQ3_S",
    "IQ1_S": "IQ1_S",
    "IQ1_M": "IQ1_S",  # IQ1_M indexes IQ1_S's grid
}


def runs(qtype: str) -> bool:
    """Whether this node's block kernels run `qtype`."""
    return native.available() and qtype in native.block_kinds()


@functools.cache
def _grid(qtype: str) -> torch.Tensor:
    return dequant_grid.grid_int8(qtype)


class NativeBlockMatrix:
    """A matrix kept in its GGUF blocks, multiplied by swarm's block kernels (CPU)."""

    def __init__(self, qtype: str, data: torch.Tensor, cols: int) -> None:
        """data: uint8 [rows, row bytes], the blocks as stored (a PackedTensor's)."""
        self.qtype = qtype
        self.data = data.contiguous()
        self.rows, self.cols = int(data.shape[0]), cols
        self.grid = _grid(_GRIDS[self.qtype]) if self.qtype in _GRIDS else None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)  # a grid is shared by every matrix of its type

    rows_alone = True  # each activation row is multiplied alone

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        out = native.block_matmul(self.qtype, self.data, self.grid, self.cols, x)
        return out if x.dtype == torch.float32 else out.to(x.dtype)
