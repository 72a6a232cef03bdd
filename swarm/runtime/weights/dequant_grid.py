"""The grid types (IQ2_*, IQ3_*, IQ1_*, IQ4_*) and the ternary ones (TQ1_0, TQ2_0)
dequantized in torch, bit for bit as the `gguf` package's numpy dequantizers (see `dequant`).

The grids (each index naming 4 or 8 small values) are the `gguf` package's own tables, read
from it at run time rather than typed in again here, so they cannot drift from what the files
were written with. `grid(qtype)` also hands them to the CPU kernels, as int8."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch

from swarm.runtime.weights.blockbits import f16, iq1_m_scale, nibbles, u16, u32

QK_K = 256
_CPU = torch.device("cpu")


def _bits(v: torch.Tensor, count: int, step: int, mask: int) -> torch.Tensor:
    """v [..., k] -> [..., k * count]: fields of `step` bits, the lowest first."""
    shifts = torch.arange(0, count * step, step, dtype=v.dtype, device=v.device)
    return ((v.unsqueeze(-1) >> shifts) & mask).flatten(-2)


def _signs(bits: torch.Tensor) -> torch.Tensor:
    """0/1 -> float32 +1/-1."""
    one = torch.ones((), dtype=torch.float32, device=bits.device)
    return torch.where(bits == 0, one, -one)


def _ksigns(index: torch.Tensor) -> torch.Tensor:
    """7-bit sign indices -> their 8 sign bits: the eighth makes the parity even (ggml's
    ksigns_iq2xs, computed instead of looked up)."""
    bits = _bits(index.to(torch.int64), 7, 1, 1)  # [..., k * 7]
    bits = bits.view(*index.shape, 7)
    parity = bits.sum(-1, keepdim=True) & 1
    return torch.cat([bits, parity], dim=-1).flatten(-2)


@functools.cache
def _gguf_grid(qtype: str) -> np.ndarray:
    from gguf import quants

    cls = getattr(quants, qtype)
    cls.init_grid()
    grid = np.asarray(cls.grid, dtype=np.float32)
    return grid.reshape(cls.grid_shape)


@functools.cache
def grid(qtype: str, device: torch.device = _CPU) -> torch.Tensor:
    """The type's grid as float32 [entries, 4 or 8] on `device`."""
    return torch.from_numpy(_gguf_grid(qtype).copy()).to(device)


def grid_int8(qtype: str) -> torch.Tensor:
    """The grid as int8 values (every entry is a small integer), for the CPU kernels."""
    return grid(qtype).to(torch.int8).contiguous()


@functools.cache
def iq4_values(device: torch.device = _CPU) -> torch.Tensor:
    from gguf import quants

    return torch.tensor(quants.IQ4_NL.kvalues, dtype=torch.float32, device=device)


def _lookup(qtype: str, index: torch.Tensor) -> torch.Tensor:
    return grid(qtype, index.device)[index.to(torch.int64)]


def iq2_xxs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = f16(b[:, :2])
    words = u32(b[:, 2:]).view(n, 8, 2)
    ls = (words[..., 1] >> 28).to(torch.float32)
    db = (d * (0.5 + ls) * 0.25).view(n, 8, 1, 1)
    signs = _signs(_ksigns(_seven(words[..., 1]))).view(n, 8, 4, 8)
    index = b[:, 2:].reshape(n, 8, 8)[..., :4]
    values = _lookup("IQ2_XXS", index).view(n, 8, 4, 8)
    return (db * values * signs).reshape(n, QK_K)


def _seven(aux: torch.Tensor) -> torch.Tensor:
    """Four 7-bit sign indices of a 32-bit word (bits 0, 7, 14, 21) -> [..., 4]."""
    return _bits(aux, 4, 7, 0x7F).view(*aux.shape, 4)


def iq2_xs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = f16(b[:, :2])
    qs = u16(b[:, 2:66])  # [n, 32]
    scales = _bits(b[:, 66:74].to(torch.int32), 2, 4, 0x0F).to(torch.float32)  # [n, 16]
    db = (d * (0.5 + scales) * 0.25).view(n, 16, 1, 1)
    signs = _signs(_ksigns(qs >> 9)).view(n, 16, 2, 8)
    values = _lookup("IQ2_XS", qs & 511).view(n, 16, 2, 8)
    return (db * values * signs).reshape(n, QK_K)


def iq2_s(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = f16(b[:, :2])
    qs, sign_bytes, qh, packed = b[:, 2:34], b[:, 34:66], b[:, 66:74], b[:, 74:82]
    scales = _bits(packed.to(torch.int32), 2, 4, 0x0F).to(torch.float32)
    db = (d * (0.5 + scales) * 0.25).view(n, 16, 1, 1)
    signs = _signs(_bits(sign_bytes, 8, 1, 1)).view(n, 16, 2, 8)
    index = qs.to(torch.int64) | (_bits(qh.to(torch.int64), 4, 2, 3) << 8)
    values = _lookup("IQ2_S", index).view(n, 16, 2, 8)
    return (db * values * signs).reshape(n, QK_K)


def iq3_xxs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = f16(b[:, :2])
    aux = u32(b[:, 66:98])  # [n, 8]
    db = (d * (0.5 + (aux >> 28).to(torch.float32)) * 0.5).view(n, 8, 1, 1)
    signs = _signs(_ksigns(_seven(aux))).view(n, 8, 4, 8)
    values = _lookup("IQ3_XXS", b[:, 2:66]).view(n, 8, 4, 8)
    return (db * values * signs).reshape(n, QK_K)


def iq3_s(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = f16(b[:, :2])
    qs, qh, sign_bytes, packed = b[:, 2:66], b[:, 66:74], b[:, 74:106], b[:, 106:110]
    scales = _bits(packed, 2, 4, 0x0F)
    db = (d * (1 + 2 * scales).to(torch.float32)).view(n, 8, 1, 1)
    signs = _signs(_bits(sign_bytes, 8, 1, 1)).view(n, 8, 4, 8)
    index = qs.to(torch.int64) | (_bits(qh.to(torch.int64), 8, 1, 1) << 8)
    values = _lookup("IQ3_S", index).view(n, 8, 4, 8)
    return (db * values * signs).reshape(n, QK_K)


_DELTA = 0.125  # IQ1's shift of every grid value, signed per group


def _delta(negative: torch.Tensor) -> torch.Tensor:
    delta = torch.full((), _DELTA, dtype=torch.float32, device=negative.device)
    return torch.where(negative == 0, delta, -delta)


def iq1_s(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = f16(b[:, :2])
    qs, qh = b[:, 2:34], u16(b[:, 34:50])  # qh [n, 8]
    dl = (d * (2 * ((qh >> 12) & 7) + 1).to(torch.float32)).view(n, 8, 1, 1)
    delta = _delta(qh & 0x8000).view(n, 8, 1, 1)
    index = qs.to(torch.int64) | (_bits(qh.to(torch.int64), 4, 3, 7) << 8)
    values = _lookup("IQ1_S", index).view(n, 8, 4, 8)
    return (dl * (values + delta)).reshape(n, QK_K)


def iq1_m(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = iq1_m_scale(b).to(torch.int16).view(torch.float16).to(torch.float32)
    scales = _bits(u16(b[:, 48:56]), 4, 3, 7)  # [n, 16]
    dl = (d * (2 * scales + 1).to(torch.float32)).view(n, 8, 2, 1, 1)
    halves = _bits(b[:, 32:48].to(torch.int64), 2, 4, 0x0F)  # [n, 32]
    index = b[:, :32].to(torch.int64) | ((halves & 7) << 8)
    delta = _delta(halves & 8).view(n, 8, 2, 2, 1)
    values = _lookup("IQ1_M", index).view(n, 8, 2, 2, 8)
    return (dl * (values + delta)).reshape(n, QK_K)


def iq4_nl(b: torch.Tensor) -> torch.Tensor:
    d = f16(b[:, :2])
    return d * iq4_values(b.device)[nibbles(b[:, 2:], 16).to(torch.int64)]


# e2m1 values, doubled (ggml's kvalues_mxfp4); the scale below is halved to match
_MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def mxfp4_values(device: torch.device = _CPU) -> torch.Tensor:
    """MXFP4's 16 code values (doubled e2m1), float32."""
    return torch.tensor(_MXFP4_VALUES, dtype=torch.float32, device=device)


def e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 exponents as float32 2**(e - 128): ggml's ggml_e8m0_to_fp32_half, bit for
    bit (e < 2 a subnormal)."""
    x = e.to(torch.int32)
    bits = torch.where(x < 2, torch.full_like(x, 0x00200000) << x, (x - 1) << 23)
    return bits.view(torch.float32)


def mxfp4(b: torch.Tensor) -> torch.Tensor:
    d = e8m0_half(b[:, :1])
    values = torch.tensor(_MXFP4_VALUES, dtype=torch.int8, device=b.device)
    return d * values[nibbles(b[:, 1:], 16).to(torch.int64)].to(torch.float32)


def iq4_xs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = f16(b[:, :2])
    high = _bits(u16(b[:, 2:4]), 8, 2, 3)  # [n, 8]
    low = _bits(b[:, 4:8].to(torch.int32), 2, 4, 0x0F)
    ls = (low | (high << 4)).to(torch.int8) - 32
    dl = (d * ls.to(torch.float32)).view(n, 8, 1)
    q = nibbles(b[:, 8:], 16).view(n, 8, 32).to(torch.int64)
    return (dl * iq4_values(b.device)[q]).reshape(n, QK_K)


def tq1_0(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = f16(b[:, 52:54])
    powers = torch.tensor([1, 3, 9, 27, 81], dtype=torch.uint8, device=b.device)
    # base-3 digits as fixed-point fractions: byte * 3^k (mod 256) keeps digit k on top
    q0 = (b[:, :32].reshape(n, 1, 32) * powers.view(1, 5, 1)).reshape(n, 160)
    q1 = (b[:, 32:48].reshape(n, 1, 16) * powers.view(1, 5, 1)).reshape(n, 80)
    qh = (b[:, 48:52].reshape(n, 1, 4) * powers[:4].view(1, 4, 1)).reshape(n, 16)
    q = torch.cat([q0, q1, qh], dim=-1).to(torch.int32)
    digits = ((q * 3) >> 8).to(torch.int8) - 1
    return d * digits.to(torch.float32)


def tq2_0(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = f16(b[:, 64:66])
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(1, 1, 4, 1)
    q = ((b[:, :64].reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, QK_K)
    return d * (q.to(torch.int8) - 1).to(torch.float32)


DECODERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "IQ2_XXS": iq2_xxs,
    "IQ2_XS": iq2_xs,
    "IQ2_S": iq2_s,
    "IQ3_XXS": iq3_xxs,
    "IQ3_S": iq3_s,
    "IQ1_S": iq1_s,
    "IQ1_M": iq1_m,
    "IQ4_NL": iq4_nl,
    "IQ4_XS": iq4_xs,
    "TQ1_0": tq1_0,
    "TQ2_0": tq2_0,
    "MXFP4": mxfp4,
}
