"""Triton decoders for GGUF's block types: one weight at a time, from the blocks as stored.

Each decoder takes `b`, pointers to the start of the block that holds each weight, `j`, the
weight's index inside its block, and `m`, which weights exist, and returns their float32
values. Every layout is ggml's (the oracle is `swarm.runtime.weights.dequant`, which the tests
compare against), and each value is formed in the reference's order (the scale times the
sub-block's scale before the code, the offset subtracted last), so the values equal the
reference's up to a fused multiply-add the compiler may form.

A tile of weights reads its scales once per weight: the loads of one block hit the same cache
lines, which keeps the decoders one expression each rather than a second pass over scales."""

# Triton's kernel language is not annotated for mypy: pyproject.toml exempts this module.

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _byte(p, m):
    return tl.load(p, mask=m, other=0).to(tl.int32)


@triton.jit
def _int8(p, m):
    v = _byte(p, m)
    return v - ((v & 128) << 1)


@triton.jit
def _half(p, m):
    bits = _byte(p, m) | (_byte(p + 1, m) << 8)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _nibble(qs, j, m, width: tl.constexpr):
    """Chunks of `width` bytes hold 2 * width codes: the low nibbles, then the high ones."""
    chunk = j // (2 * width)
    within = j % (2 * width)
    byte = _byte(qs + chunk * width + within % width, m)
    return (byte >> ((within // width) * 4)) & 15


@triton.jit
def _crumb(qs, j, m):
    """K-quants' 2-bit codes: chunks of 32 bytes give 128 codes, bits 0-1 first, then 2-3..."""
    byte = _byte(qs + (j // 128) * 32 + j % 32, m)
    return (byte >> (((j % 128) // 32) * 2)) & 3


@triton.jit
def _k_scale_min(s, g, m):
    """Q4_K's and Q5_K's sub-block g: its 6-bit scale and min from the 12 scale bytes."""
    low = _byte(s + g % 4, m)
    mins = _byte(s + 4 + g % 4, m)
    both = _byte(s + 8 + g % 4, m)
    sc = tl.where(g < 4, low & 63, (both & 15) | ((low >> 2) & 48))
    mn = tl.where(g < 4, mins & 63, (both >> 4) | ((mins >> 2) & 48))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def q4_0(b, j, m):
    return _half(b, m) * (_nibble(b + 2, j, m, 16) - 8).to(tl.float32)


@triton.jit
def q4_1(b, j, m):
    return _half(b, m) * _nibble(b + 4, j, m, 16).to(tl.float32) + _half(b + 2, m)


@triton.jit
def _fifth(qh, j, m):
    return ((_byte(qh + j // 8, m) >> (j % 8)) & 1) << 4


@triton.jit
def q5_0(b, j, m):
    q = _nibble(b + 6, j, m, 16) | _fifth(b + 2, j, m)
    return _half(b, m) * (q - 16).to(tl.float32)


@triton.jit
def q5_1(b, j, m):
    q = _nibble(b + 8, j, m, 16) | _fifth(b + 4, j, m)
    return _half(b, m) * q.to(tl.float32) + _half(b + 2, m)


@triton.jit
def q8_0(b, j, m):
    return _int8(b + 2 + j, m).to(tl.float32) * _half(b, m)


@triton.jit
def q2_k(b, j, m):
    sc = _byte(b + j // 16, m)
    low = _half(b + 80, m) * (sc & 15).to(tl.float32)
    offset = _half(b + 82, m) * (sc >> 4).to(tl.float32)
    return low * _crumb(b + 16, j, m).to(tl.float32) - offset


@triton.jit
def q3_k(b, j, m):
    g = j // 16
    low = _byte(b + 96 + g % 8, m) >> ((g // 8) * 4)
    high = _byte(b + 104 + g % 4, m) >> ((g // 4) * 2)
    scale = ((low & 15) | ((high & 3) << 4)) - 32
    missing = ((_byte(b + j % 32, m) >> (j // 32)) & 1) ^ 1  # a clear hmask bit subtracts 4
    q = _crumb(b + 32, j, m) - (missing << 2)
    return (_half(b + 108, m) * scale.to(tl.float32)) * q.to(tl.float32)


@triton.jit
def q4_k(b, j, m):
    sc, mn = _k_scale_min(b + 4, j // 32, m)
    q = _nibble(b + 16, j, m, 32).to(tl.float32)
    return (_half(b, m) * sc) * q - _half(b + 2, m) * mn


@triton.jit
def q5_k(b, j, m):
    g = j // 32
    sc, mn = _k_scale_min(b + 4, g, m)
    high = ((_byte(b + 16 + j % 32, m) >> g) & 1) << 4  # sub-block g takes bit g
    q = (_nibble(b + 48, j, m, 32) | high).to(tl.float32)
    return (_half(b, m) * sc) * q - _half(b + 2, m) * mn


@triton.jit
def q6_k(b, j, m):
    low = _nibble(b, j, m, 64)
    high = _crumb(b + 128, j, m)
    q = (low | (high << 4)) - 32
    scale = _half(b + 208, m) * _int8(b + 192 + j // 16, m).to(tl.float32)
    return scale * q.to(tl.float32)


@triton.jit
def iq4_nl(b, j, m, table):
    q = _nibble(b + 2, j, m, 16)
    return _half(b, m) * tl.load(table + q, mask=m, other=0.0)


@triton.jit
def iq4_xs(b, j, m, table):
    g = j // 32
    high = ((_byte(b + 2, m) | (_byte(b + 3, m) << 8)) >> (g * 2)) & 3
    low = (_byte(b + 4 + g // 2, m) >> ((g % 2) * 4)) & 15
    scale = (low | (high << 4)) - 32
    q = _nibble(b + 8, j, m, 16)
    return (_half(b, m) * scale.to(tl.float32)) * tl.load(table + q, mask=m, other=0.0)


@triton.jit
def mxfp4(b, j, m, table):
    # the E8M0 exponent as float32 2**(e - 128) (ggml's half scale; e < 2 a subnormal)
    e = _byte(b, m)
    bits = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    d = bits.to(tl.float32, bitcast=True)
    q = _nibble(b + 1, j, m, 16)
    return d * tl.load(table + 16 + q, mask=m, other=0.0)


@triton.jit
def weights(b, j, m, table, QTYPE: tl.constexpr):
    """The weights at (b, j) of a matrix in QTYPE: float32, 0 where m is false."""
    if QTYPE == "Q4_0":
        w = q4_0(b, j, m)
    elif QTYPE == "Q4_1":
        w = q4_1(b, j, m)
    elif QTYPE == "Q5_0":
        w = q5_0(b, j, m)
    elif QTYPE == "Q5_1":
        w = q5_1(b, j, m)
    elif QTYPE == "Q8_0":
        w = q8_0(b, j, m)
    elif QTYPE == "Q2_K":
        w = q2_k(b, j, m)
    elif QTYPE == "Q3_K":
        w = q3_k(b, j, m)
    elif QTYPE == "Q4_K":
        w = q4_k(b, j, m)
    elif QTYPE == "Q5_K":
        w = q5_k(b, j, m)
    elif QTYPE == "Q6_K":
        w = q6_k(b, j, m)
    elif QTYPE == "IQ4_NL":
        w = iq4_nl(b, j, m, table)
    elif QTYPE == "IQ4_XS":
        w = iq4_xs(b, j, m, table)
    else:
        tl.static_assert(QTYPE == "MXFP4")
        w = mxfp4(b, j, m, table)
    return tl.where(m, w, 0.0)
