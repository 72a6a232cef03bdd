"""GGUF's quantized block formats: every type swarm runs (`BLOCKS`), how big its blocks are
and where their float16 scales lie, and the 4-bit types decoded into groups.

`BLOCKS` lists every block type llama.cpp writes for a model's weights; each has a bit-exact
dequantizer (`swarm.runtime.weights.dequant`) and a CPU kernel (`swarm.runtime.weights.blocks`).
Q8_1 and Q8_K (llama.cpp's own activation formats, never a file's weights), NVFP4, Q1_0
and the integer types are refused by name.

The types in `FORMATS` also decode to small integer codes plus one scale and one offset per
group of columns, so that weight = code * scale + offset. That form feeds the 4-bit group
kernels (a 4-bit type with groups of 32 is exactly torch's int4 group-wise layout). The
layouts follow ggml's reference (and the `gguf` package's dequantizers, which the tests
compare against)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from swarm.errors import ModelError
from swarm.runtime.weights.blockbits import f16 as _f16
from swarm.runtime.weights.blockbits import iq1_m_scale, k_scales
from swarm.runtime.weights.blockbits import nibbles as _nibbles

QK_K = 256  # elements in one K-quant super-block


@dataclass(frozen=True)
class BlockFormat:
    elements: int  # weights per block
    nbytes: int  # bytes per block
    group: int  # weights sharing one scale and offset
    bits: int  # bits per code


FORMATS = {
    "Q4_0": BlockFormat(32, 18, 32, 4),
    "Q4_1": BlockFormat(32, 20, 32, 4),
    "Q8_0": BlockFormat(32, 34, 32, 8),
    "Q4_K": BlockFormat(QK_K, 144, 32, 4),
    "Q5_K": BlockFormat(QK_K, 176, 32, 5),
    "Q6_K": BlockFormat(QK_K, 210, 16, 6),
}


@dataclass(frozen=True)
class BlockType:
    elements: int  # weights per block
    nbytes: int  # bytes per block
    halves: tuple[int, ...]  # where in a block its float16 scales lie (byte offsets)


BLOCKS = {
    "Q4_0": BlockType(32, 18, (0,)),
    "Q4_1": BlockType(32, 20, (0, 2)),
    "Q5_0": BlockType(32, 22, (0,)),
    "Q5_1": BlockType(32, 24, (0, 2)),
    "Q8_0": BlockType(32, 34, (0,)),
    "Q2_K": BlockType(QK_K, 84, (80, 82)),
    "Q3_K": BlockType(QK_K, 110, (108,)),
    "Q4_K": BlockType(QK_K, 144, (0, 2)),
    "Q5_K": BlockType(QK_K, 176, (0, 2)),
    "Q6_K": BlockType(QK_K, 210, (208,)),
    "IQ2_XXS": BlockType(QK_K, 66, (0,)),
    "IQ2_XS": BlockType(QK_K, 74, (0,)),
    "IQ2_S": BlockType(QK_K, 82, (0,)),
    "IQ3_XXS": BlockType(QK_K, 98, (0,)),
    "IQ3_S": BlockType(QK_K, 110, (0,)),
    "IQ1_S": BlockType(QK_K, 50, (0,)),
    "IQ1_M": BlockType(QK_K, 56, ()),  # its scale is spread over four nibbles: iq1_m_scale
    "IQ4_NL": BlockType(32, 18, (0,)),
    "IQ4_XS": BlockType(QK_K, 136, (0,)),
    "TQ1_0": BlockType(QK_K, 54, (52,)),
    "TQ2_0": BlockType(QK_K, 66, (64,)),
    "MXFP4": BlockType(32, 17, ()),  # its scale is a power of two (E8M0), always finite
}
FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED = (*FLOAT_TYPES, *BLOCKS)


class UnsupportedQuantError(ModelError):
    """A tensor uses a GGUF type this runtime does not run."""


def check_supported(qtype: str, tensor: str) -> None:
    if qtype not in SUPPORTED:
        raise UnsupportedQuantError(
            f"tensor {tensor} uses quantization type {qtype}, which swarm does not run; "
            f"supported types: {', '.join(SUPPORTED)}"
        )


def row_bytes(qtype: str, cols: int) -> int:
    kind = BLOCKS[qtype]
    return cols // kind.elements * kind.nbytes


def first_bad_block(qtype: str, data: torch.Tensor) -> int | None:
    """The index of the first block (in row order) whose float16 scale is infinite or NaN,
    or None: such a block would turn every product it enters into inf or NaN."""
    kind = BLOCKS[qtype]
    blocks = data.reshape(-1, kind.nbytes)
    if qtype == "IQ1_M":
        halves = [iq1_m_scale(blocks).to(torch.int16).view(torch.float16)]
    else:
        halves = [blocks[:, at : at + 2].contiguous().view(torch.float16) for at in kind.halves]
    bad = torch.zeros(blocks.shape[0], dtype=torch.bool, device=blocks.device)
    for h in halves:
        bad |= ~torch.isfinite(h).view(-1)
    where = torch.nonzero(bad)
    return int(where[0, 0]) if where.numel() else None


@dataclass(frozen=True)
class Decoded:
    codes: torch.Tensor  # int8 [rows, cols]
    scale: torch.Tensor  # float32 [rows, cols // group]
    offset: torch.Tensor  # float32 [rows, cols // group]
    group: int

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        rows, cols = self.codes.shape
        grouped = self.codes.to(torch.float32).view(rows, cols // self.group, self.group)
        w = grouped * self.scale.unsqueeze(-1) + self.offset.unsqueeze(-1)
        return w.view(rows, cols).to(dtype)


def decode(qtype: str, data: torch.Tensor, cols: int) -> Decoded:
    """data: uint8 [rows, row_bytes] (whole blocks per row) -> codes, scales and offsets."""
    fmt = FORMATS[qtype]
    rows = data.shape[0]
    blocks = data.reshape(-1, fmt.nbytes)  # [rows * blocks_per_row, nbytes]
    codes, scale, offset = _DECODERS[qtype](blocks)
    return Decoded(
        codes.reshape(rows, cols),
        scale.reshape(rows, cols // fmt.group),
        offset.reshape(rows, cols // fmt.group),
        fmt.group,
    )


Parts = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _q4_0(b: torch.Tensor) -> Parts:
    d = _f16(b[:, :2])
    codes = _nibbles(b[:, 2:], 16)
    return codes.to(torch.int8), d, -8 * d


def _q4_1(b: torch.Tensor) -> Parts:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    return _nibbles(b[:, 4:], 16).to(torch.int8), d, m


def _q8_0(b: torch.Tensor) -> Parts:
    d = _f16(b[:, :2])
    return b[:, 2:].contiguous().view(torch.int8), d, torch.zeros_like(d)


def _q4_k(b: torch.Tensor) -> Parts:
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = k_scales(b[:, 4:16])
    return _nibbles(b[:, 16:], 32).to(torch.int8), d * sc, -(dmin * mn)


def _q5_k(b: torch.Tensor) -> Parts:
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = k_scales(b[:, 4:16])
    low = _nibbles(b[:, 48:], 32).view(-1, 8, 32)
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device).view(1, 8, 1)
    high = (b[:, 16:48].reshape(-1, 1, 32) >> shifts) & 1  # sub-block j takes bit j
    codes = (low | (high << 4)).reshape(b.shape[0], -1)
    return codes.to(torch.int8), d * sc, -(dmin * mn)


def _q6_k(b: torch.Tensor) -> Parts:
    n = b.shape[0]
    low = _nibbles(b[:, :128], 64).view(n, 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(1, 1, 4, 1)
    high = ((b[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 8, 32)
    codes = (low | (high << 4)).to(torch.int8) - 32
    scales = b[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = _f16(b[:, 208:210])
    scale = d * scales
    return codes.reshape(n, -1), scale, torch.zeros_like(scale)


_DECODERS = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q8_0": _q8_0,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}
