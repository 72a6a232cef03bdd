"""Bit fields of GGUF's blocks read in torch: float16 scales, nibbles, little-endian words,
the K-quants' packed 6-bit scales. Shared by the dequantizers and the 4-bit group decoder."""

from __future__ import annotations

import torch


def f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] bytes -> float32 [n, 1]."""
    return b.contiguous().view(torch.float16).to(torch.float32)


def nibbles(qs: torch.Tensor, width: int) -> torch.Tensor:
    """Bytes [n, chunks * width] -> codes [n, chunks * 2 * width]: each chunk's low nibbles,
    then its high nibbles."""
    q = qs.reshape(qs.shape[0], -1, 1, width)
    shifts = torch.tensor([0, 4], dtype=torch.uint8, device=qs.device).view(1, 1, 2, 1)
    return ((q >> shifts) & 0x0F).reshape(qs.shape[0], -1)


def u16(b: torch.Tensor) -> torch.Tensor:
    """Little-endian bytes [n, 2k] -> int32 [n, k]."""
    w = b.reshape(b.shape[0], -1, 2).to(torch.int32)
    return w[..., 0] | (w[..., 1] << 8)


def u32(b: torch.Tensor) -> torch.Tensor:
    """Little-endian bytes [n, 4k] -> int64 [n, k]."""
    w = b.reshape(b.shape[0], -1, 4).to(torch.int64)
    return w[..., 0] | (w[..., 1] << 8) | (w[..., 2] << 16) | (w[..., 3] << 24)


def k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's and Q5_K's 12 bytes -> eight 6-bit scales and eight 6-bit mins, float32."""
    s = s.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc.to(torch.float32), mn.to(torch.float32)


def iq1_m_scale(b: torch.Tensor) -> torch.Tensor:
    """IQ1_M's float16 scale, spread over the top nibbles of its four 16-bit scale words:
    [n, 1] as raw float16 bits (int32)."""
    s = u16(b[:, 48:56])  # [n, 4]
    top = s & 0xF000
    return (top[:, 0:1] >> 12) | (top[:, 1:2] >> 8) | (top[:, 2:3] >> 4) | top[:, 3:4]
