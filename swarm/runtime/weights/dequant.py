"""GGUF's blocks dequantized in torch, bit for bit what the `gguf` package's numpy
dequantizers give (and so what transformers loads from the same file).

Each decoder takes whole blocks, uint8 [n, block bytes] on any device, and returns float32
[n, block elements]. Every float operation is the reference's own, in its order (d * sc before
the codes, products before sums, no fused multiply-adds): IEEE float32 rounds each the same
way, which is what makes the results equal rather than close. The legacy and K-quant types are
here, the grid types (IQ*, TQ*) in `dequant_grid`.

`dequantize` runs a matrix a slice of rows at a time into a tensor of the asked dtype, so
dequantizing to bfloat16 never holds the whole matrix in float32."""

from __future__ import annotations

from collections.abc import Callable

import torch

from swarm.runtime.weights import dequant_grid, ggml
from swarm.runtime.weights.blockbits import f16, k_scales, nibbles

QK_K = ggml.QK_K
_SLICE_ELEMENTS = 1 << 21  # weights dequantized at once: 8 MB of float32 in flight

Decoder = Callable[[torch.Tensor], torch.Tensor]


def _shifts(values: list[int], shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device).view(shape)


def q4_0(b: torch.Tensor) -> torch.Tensor:
    d = f16(b[:, :2])
    q = nibbles(b[:, 2:], 16).to(torch.int8) - 8
    return d * q.to(torch.float32)


def q4_1(b: torch.Tensor) -> torch.Tensor:
    d, m = f16(b[:, :2]), f16(b[:, 2:4])
    return d * nibbles(b[:, 4:], 16).to(torch.float32) + m


def _five_bit(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """qh: 4 bytes (bit i: the fifth bit of element i), qs: 16 bytes of nibbles -> 0..31."""
    bits = _shifts(list(range(8)), (1, 1, 8), qh)
    high = ((qh.reshape(-1, 4, 1) >> bits) & 1).reshape(-1, 32)
    return nibbles(qs, 16) | (high << 4)


def q5_0(b: torch.Tensor) -> torch.Tensor:
    d = f16(b[:, :2])
    q = _five_bit(b[:, 2:6], b[:, 6:]).to(torch.int8) - 16
    return d * q.to(torch.float32)


def q5_1(b: torch.Tensor) -> torch.Tensor:
    d, m = f16(b[:, :2]), f16(b[:, 2:4])
    return d * _five_bit(b[:, 4:8], b[:, 8:]).to(torch.float32) + m


def q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).to(torch.float32) * f16(b[:, :2])


def _crumbs(qs: torch.Tensor, width: int) -> torch.Tensor:
    """Bytes [n, chunks * width] -> 2-bit codes [n, chunks * 4 * width]: each chunk's bits
    0-1, then 2-3, 4-5, 6-7."""
    q = qs.reshape(qs.shape[0], -1, 1, width) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), qs)
    return (q & 3).reshape(qs.shape[0], -1)


def q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = f16(b[:, 80:82]), f16(b[:, 82:84])
    dl = (d * (scales & 0xF).to(torch.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).to(torch.float32)).reshape(n, 16, 1)
    q = _crumbs(qs, 32).reshape(n, 16, 16).to(torch.float32)
    return (dl * q - ml).reshape(n, QK_K)


def q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask, qs, packed, d = b[:, :32], b[:, 32:96], b[:, 96:108], f16(b[:, 108:110])
    low = (packed[:, :8].reshape(n, 1, 8) >> _shifts([0, 4], (1, 2, 1), b)).reshape(n, 16)
    high = (packed[:, 8:].reshape(n, 1, 4) >> _shifts([0, 2, 4, 6], (1, 4, 1), b)).reshape(n, 16)
    scales = ((low & 0x0F) | ((high & 0x03) << 4)).to(torch.int8) - 32
    dl = (d * scales.to(torch.float32)).reshape(n, 16, 1)
    ql = _crumbs(qs, 32).reshape(n, 16, 16)
    bits = _shifts(list(range(8)), (1, 1, 8, 1), b)
    qh = ((hmask.reshape(n, 1, 1, 32) >> bits) & 1).reshape(n, 16, 16) ^ 1
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).to(torch.float32)
    return (dl * q).reshape(n, QK_K)


def q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = f16(b[:, :2]), f16(b[:, 2:4])
    sc, mn = k_scales(b[:, 4:16])
    scale, low = (d * sc).reshape(n, 8, 1), (dmin * mn).reshape(n, 8, 1)
    q = nibbles(b[:, 16:], 32).reshape(n, 8, 32).to(torch.float32)
    return (scale * q - low).reshape(n, QK_K)


def q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = f16(b[:, :2]), f16(b[:, 2:4])
    sc, mn = k_scales(b[:, 4:16])
    scale, low = (d * sc).reshape(n, 8, 1), (dmin * mn).reshape(n, 8, 1)
    bits = _shifts(list(range(8)), (1, 8, 1), b)
    high = (b[:, 16:48].reshape(n, 1, 32) >> bits) & 1  # sub-block j takes bit j
    q = (nibbles(b[:, 48:], 32).reshape(n, 8, 32) | (high << 4)).to(torch.float32)
    return (scale * q - low).reshape(n, QK_K)


def q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    low = nibbles(b[:, :128], 64).reshape(n, 8, 32)
    high = (b[:, 128:192].reshape(n, 2, 1, 32) >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), b)) & 3
    q = (low | (high.reshape(n, 8, 32) << 4)).to(torch.int8) - 32
    scales = b[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = (f16(b[:, 208:210]) * scales).reshape(n, 16, 1)
    return (d * q.reshape(n, 16, 16).to(torch.float32)).reshape(n, QK_K)


DECODERS: dict[str, Decoder] = {
    "Q4_0": q4_0,
    "Q4_1": q4_1,
    "Q5_0": q5_0,
    "Q5_1": q5_1,
    "Q8_0": q8_0,
    "Q2_K": q2_k,
    "Q3_K": q3_k,
    "Q4_K": q4_k,
    "Q5_K": q5_k,
    "Q6_K": q6_k,
    **dequant_grid.DECODERS,
}


def dequantize(
    qtype: str, data: torch.Tensor, cols: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """uint8 [rows, row bytes] (whole blocks per row) -> [rows, cols] in `dtype`, on data's
    device, a slice of rows at a time."""
    kind = ggml.BLOCKS[qtype]
    rows = int(data.shape[0])
    out = torch.empty(rows, cols, dtype=dtype, device=data.device)
    step = max(1, _SLICE_ELEMENTS // max(cols, 1))
    decoder = DECODERS[qtype]
    for start in range(0, rows, step):
        part = data[start : start + step]
        values = decoder(part.reshape(-1, kind.nbytes))
        out[start : start + part.shape[0]] = values.view(part.shape[0], cols)
    return out
