"""K-quant packing in numpy (the `gguf` package dequantizes these types but does not quantize
them), vectorised over blocks. `pack_*` lays out given codes and scales bit for bit as
ggml does; `quantize_*` picks codes and scales for float weights with a plain min/max rule (not
llama.cpp's search, so slightly coarser, which does not matter for seeded test models)."""

from __future__ import annotations

import numpy as np

QK_K = 256


def pack_q4_k(
    d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, mn: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """d, dmin: [n] float; sc, mn: [n, 8] in 0..63; q: [n, 256] in 0..15 -> uint8 [n, 144].
    Weight j of sub-block s is d * sc[s] * q - dmin * mn[s]."""
    n = q.shape[0]
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    scales = np.concatenate(
        [
            (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6),
            (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4),
        ],
        axis=1,
    )
    chunks = q.astype(np.uint8).reshape(n, 4, 2, 32)  # 64-weight chunks: low, high nibbles
    qs = (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), scales, qs], axis=1)


def pack_q6_k(d: np.ndarray, sc: np.ndarray, q: np.ndarray) -> np.ndarray:
    """d: [n] float; sc: [n, 16] in -128..127; q: [n, 256] in 0..63 -> uint8 [n, 210].
    Weight j of sub-block s is d * sc[s] * (q - 32)."""
    n = q.shape[0]
    q = q.astype(np.uint8).reshape(n, 2, 128)  # two halves of 128 weights
    low = q & 15
    ql = (low[:, :, :64] | (low[:, :, 64:] << 4)).reshape(n, 128)
    high = (q >> 4).reshape(n, 2, 4, 32)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    scales = sc.astype(np.int8).view(np.uint8)
    return np.concatenate([ql, qh.reshape(n, 64), scales, _f16_bytes(d)], axis=1)


def pack_q2_k(
    d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, mn: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """d, dmin: [n] float; sc, mn: [n, 16] in 0..15; q: [n, 256] in 0..3 -> uint8 [n, 84].
    Weight j of sub-block s (16 weights) is d * sc[s] * q - dmin * mn[s]."""
    scales = (sc.astype(np.uint8) & 15) | (mn.astype(np.uint8) << 4)
    return np.concatenate([scales, _two_bit_planes(q), _f16_bytes(d), _f16_bytes(dmin)], axis=1)


def pack_q3_k(d: np.ndarray, sc: np.ndarray, q: np.ndarray) -> np.ndarray:
    """d: [n] float; sc: [n, 16] in -32..31; q: [n, 256] in 0..7 -> uint8 [n, 110].
    Weight j of sub-block s (16 weights) is d * sc[s] * (q - 4)."""
    n = q.shape[0]
    q = q.astype(np.uint8)
    # bit 2 of weight j sits in hmask[j % 32], bit j // 32 (ggml stores it set for q >= 4)
    high = (q >> 2).reshape(n, 8, 32)
    hmask = np.bitwise_or.reduce(high << np.arange(8, dtype=np.uint8)[:, None], axis=1)
    u = (sc.astype(np.int16) + 32).astype(np.uint8)  # stored 6-bit with +32
    low, top = u & 15, u >> 4
    scales = np.concatenate(
        [
            low[:, :8] | (low[:, 8:] << 4),  # byte i: scale i, scale i + 8 (low nibbles)
            top[:, :4] | (top[:, 4:8] << 2) | (top[:, 8:12] << 4) | (top[:, 12:] << 6),
        ],
        axis=1,
    )
    return np.concatenate([hmask, _two_bit_planes(q & 3), scales, _f16_bytes(d)], axis=1)


def pack_q5_k(
    d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, mn: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """d, dmin: [n] float; sc, mn: [n, 8] in 0..63; q: [n, 256] in 0..31 -> uint8 [n, 176].
    Weight j of sub-block s (32 weights) is d * sc[s] * q - dmin * mn[s]."""
    n = q.shape[0]
    q = q.astype(np.uint8)
    four = pack_q4_k(d, dmin, sc, mn, q & 15)  # d, dmin, scales, low nibbles as Q4_K's
    # bit 4 of weight j sits in qh[j % 32], bit j // 32
    high = (q >> 4).reshape(n, 8, 32)
    qh = np.bitwise_or.reduce(high << np.arange(8, dtype=np.uint8)[:, None], axis=1)
    return np.concatenate([four[:, :16], qh, four[:, 16:]], axis=1)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float [rows, cols] (cols a multiple of 256) -> uint8 [rows, cols / 256 * 144]."""
    rows = x.shape[0]
    blocks = x.astype(np.float32).reshape(-1, 8, 32)
    lo = np.minimum(blocks.min(axis=2), 0.0)
    scale = (blocks.max(axis=2) - lo) / 15
    d = scale.max(axis=1) / 63
    dmin = (-lo).max(axis=1) / 63
    d16, dmin16 = _as_f16(d), _as_f16(dmin)
    sc = np.clip(np.round(scale / _nonzero(d16)[:, None]), 0, 63)
    mn = np.clip(np.round(-lo / _nonzero(dmin16)[:, None]), 0, 63)
    step = _nonzero(d16[:, None] * sc)[..., None]
    q = np.clip(np.round((blocks + (dmin16[:, None] * mn)[..., None]) / step), 0, 15)
    return pack_q4_k(d16, dmin16, sc, mn, q.reshape(-1, QK_K)).reshape(rows, -1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float [rows, cols] (cols a multiple of 256) -> uint8 [rows, cols / 256 * 210]."""
    rows = x.shape[0]
    blocks = x.astype(np.float32).reshape(-1, 16, 16)
    scale = np.abs(blocks).max(axis=2) / 31
    d = scale.max(axis=1) / 127
    d16 = _as_f16(d)
    sc = np.clip(np.round(scale / _nonzero(d16)[:, None]), -128, 127)
    step = _nonzero(d16[:, None] * sc)[..., None]
    q = np.clip(np.round(blocks / step), -32, 31) + 32
    return pack_q6_k(d16, sc, q.reshape(-1, QK_K)).reshape(rows, -1)


def _two_bit_planes(q: np.ndarray) -> np.ndarray:
    """[n, 256] in 0..3 -> uint8 [n, 64]: per half of 128 weights, byte m holds weights
    m, m + 32, m + 64, m + 96 in bits 0-1, 2-3, 4-5, 6-7 (Q2_K's qs, Q3_K's low bits)."""
    n = q.shape[0]
    parts = q.astype(np.uint8).reshape(n, 2, 4, 32)
    planes = parts[:, :, 0] | (parts[:, :, 1] << 2) | (parts[:, :, 2] << 4) | (parts[:, :, 3] << 6)
    return planes.reshape(n, 64)


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(v.astype(np.float16)).view(np.uint8).reshape(-1, 2)


def _as_f16(v: np.ndarray) -> np.ndarray:
    """The value the block will hold."""
    return v.astype(np.float16).astype(np.float32)


def _nonzero(v: np.ndarray) -> np.ndarray:
    return np.where(v == 0, 1.0, v).astype(np.float32)
