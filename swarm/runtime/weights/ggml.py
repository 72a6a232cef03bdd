"""GGUF's quantized block formats, decoded in torch.

Every supported type decodes to small integer codes plus one scale and one offset per group of
columns, so that weight = code * scale + offset. That form feeds the CPU kernels (a 4-bit type
with groups of 32 is exactly torch's int4 group-wise layout) and the plain dequantizer used on
other devices. The layouts follow ggml's reference (and the `gguf` package's dequantizers,
which the tests compare against)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from swarm.errors import ModelError

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
FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED = (*FLOAT_TYPES, *FORMATS)


class UnsupportedQuantError(ModelError):
    """A tensor uses a GGUF type this runtime does not run."""


def check_supported(qtype: str, tensor: str) -> None:
    if qtype not in SUPPORTED:
        raise UnsupportedQuantError(
            f"tensor {tensor} uses quantization type {qtype}, which swarm does not run; "
            f"supported types: {', '.join(SUPPORTED)}"
        )


def row_bytes(qtype: str, cols: int) -> int:
    fmt = FORMATS[qtype]
    return cols // fmt.elements * fmt.nbytes


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


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] bytes -> float32 [n, 1]."""
    return b.contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor, width: int) -> torch.Tensor:
    """Bytes [n, chunks * width] -> codes [n, chunks * 2 * width]: each chunk's low nibbles,
    then its high nibbles."""
    q = qs.reshape(qs.shape[0], -1, 1, width)
    shifts = torch.tensor([0, 4], dtype=torch.uint8, device=qs.device).view(1, 1, 2, 1)
    return ((q >> shifts) & 0x0F).reshape(qs.shape[0], -1)


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


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 bytes -> eight 6-bit scales and eight 6-bit mins per super-block."""
    s = s.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc.to(torch.float32), mn.to(torch.float32)


def _q4_k(b: torch.Tensor) -> Parts:
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    return _nibbles(b[:, 16:], 32).to(torch.int8), d * sc, -(dmin * mn)


def _q5_k(b: torch.Tensor) -> Parts:
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
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
