"""A packed matrix on a CUDA device, multiplied by the Triton kernels (`products`)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

# Every type with a kernel: the rest are dequantized to float16 once, at load.
KERNEL_TYPES = frozenset(
    {
        "Q4_0",
        "Q4_1",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "IQ4_NL",
        "IQ4_XS",
        "MXFP4",
    }
)
DECODE_ROWS = 8  # up to this many activation rows take the fused decode kernel
_DECODE_N = 32  # weight rows per decode program
_DECODE_TILE = 8192  # activation rows x weight rows x columns of one decode program's step
_PREFILL_N = 64  # weight rows per prefill program
_PREFILL_K = 32  # columns per prefill step


def available() -> bool:
    """Whether Triton is installed (`pip install swarm-homelab[cuda]`)."""
    return importlib.util.find_spec("triton") is not None


@dataclass(frozen=True)
class BlockLayout:
    qtype: str  # a GGUF block type in KERNEL_TYPES
    elements: int  # weights per block
    nbytes: int  # bytes per block


class TritonBlockMatrix:
    """W [rows, cols] as GGUF blocks in device memory, exactly as stored (1.00x its bytes)."""

    # a row's sums depend on how many rows share the launch (its kernel and tile sizes)
    rows_alone = False

    def __init__(
        self, layout: BlockLayout, data: torch.Tensor, cols: int, table: torch.Tensor
    ) -> None:
        """data: uint8 [rows, row bytes]; table: float32 [32] on data's device, the IQ4
        values then MXFP4's (read by those types only)."""
        if layout.qtype not in KERNEL_TYPES:
            raise ValueError(f"no GPU kernel for block type {layout.qtype}")
        self.layout = layout
        self.data = data.contiguous()
        self.rows, self.cols = int(data.shape[0]), cols
        self.table = table

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.cols).contiguous()  # [m, cols]
        out = torch.empty(flat.shape[0], self.rows, dtype=x.dtype, device=x.device)
        if flat.shape[0]:
            self._launch(flat, out)
        return out.view(*x.shape[:-1], self.rows)

    def _launch(self, x: torch.Tensor, out: torch.Tensor) -> None:
        from swarm.runtime.gpu import products  # imports Triton

        m = int(x.shape[0])
        lay = self.layout
        args: tuple[Any, ...] = (
            x,
            self.data,
            self.table,
            out,
            m,
            self.rows,
            self.cols,
            int(self.data.shape[1]),
            int(x.stride(0)),
            int(out.stride(0)),
        )
        if m <= DECODE_ROWS:
            block_m = 1 << (m - 1).bit_length()  # 1, 2, 4 or 8
            block_k = max(32, _DECODE_TILE // (block_m * _DECODE_N))
            grid: tuple[int, ...] = products.grid(1, self.rows, 1, _DECODE_N)[1:]
            kernel = products.decode_kernel
            blocks = (block_m, _DECODE_N, block_k)
        else:
            block_m = 16 if m <= 16 else 32 if m <= 32 else 64
            grid = products.grid(m, self.rows, block_m, _PREFILL_N)
            kernel = products.prefill_kernel
            blocks = (block_m, _PREFILL_N, _PREFILL_K)
        kernel[grid](
            *args,
            QTYPE=lay.qtype,
            ELEMENTS=lay.elements,
            NBYTES=lay.nbytes,
            BLOCK_M=blocks[0],
            BLOCK_N=blocks[1],
            BLOCK_K=blocks[2],
        )
