"""`harness.kquants`' Q2_K, Q3_K and Q5_K packers: given codes and scales come back from the
`gguf` package's dequantizer (a port of ggml's dequantize_row_*) as the formula each type
documents, bit for bit, in float32 as the dequantizer computes it."""

from __future__ import annotations

import numpy as np
import pytest

from harness.kquants import pack_q2_k, pack_q3_k, pack_q5_k

N = 4  # blocks


def _f16(rng: np.random.Generator) -> np.ndarray:
    """[N] float32 values a float16 field holds exactly."""
    return rng.uniform(0.01, 0.1, N).astype(np.float16).astype(np.float32)


def _dequantize(blocks: np.ndarray, qtype: str) -> np.ndarray:
    from gguf import GGMLQuantizationType, dequantize

    return dequantize(blocks, GGMLQuantizationType[qtype])


def test_q2_k_is_d_sc_q_less_dmin_mn_per_16() -> None:
    rng = np.random.default_rng(0)
    d, dmin = _f16(rng), _f16(rng)
    sc, mn = rng.integers(0, 16, (N, 16)), rng.integers(0, 16, (N, 16))
    q = rng.integers(0, 4, (N, 256))
    blocks = pack_q2_k(d, dmin, sc, mn, q)
    assert blocks.shape == (N, 84) and blocks.dtype == np.uint8
    step = (d[:, None] * sc.astype(np.float32))[..., None]  # [N, 16 sub-blocks, 1]
    low = (dmin[:, None] * mn.astype(np.float32))[..., None]
    want = step * q.reshape(N, 16, 16).astype(np.float32) - low
    np.testing.assert_array_equal(_dequantize(blocks, "Q2_K").reshape(N, 16, 16), want)


def test_q3_k_is_d_sc_q_less_4_per_16_with_signed_scales() -> None:
    rng = np.random.default_rng(1)
    d = _f16(rng)
    sc = rng.integers(-32, 32, (N, 16))
    sc[0] = np.arange(-32, 32, 4)  # both ends of the 6-bit range
    q = rng.integers(0, 8, (N, 256))
    blocks = pack_q3_k(d, sc, q)
    assert blocks.shape == (N, 110) and blocks.dtype == np.uint8
    step = (d[:, None] * sc.astype(np.float32))[..., None]
    want = step * (q.reshape(N, 16, 16) - 4).astype(np.float32)
    np.testing.assert_array_equal(_dequantize(blocks, "Q3_K").reshape(N, 16, 16), want)


def test_q5_k_is_d_sc_q_less_dmin_mn_per_32() -> None:
    rng = np.random.default_rng(2)
    d, dmin = _f16(rng), _f16(rng)
    sc, mn = rng.integers(0, 64, (N, 8)), rng.integers(0, 64, (N, 8))
    q = rng.integers(0, 32, (N, 256))
    blocks = pack_q5_k(d, dmin, sc, mn, q)
    assert blocks.shape == (N, 176) and blocks.dtype == np.uint8
    step = (d[:, None] * sc.astype(np.float32))[..., None]  # [N, 8 sub-blocks, 1]
    low = (dmin[:, None] * mn.astype(np.float32))[..., None]
    want = step * q.reshape(N, 8, 32).astype(np.float32) - low
    np.testing.assert_array_equal(_dequantize(blocks, "Q5_K").reshape(N, 8, 32), want)


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "Q5_K"])
def test_float16_fields_sit_where_swarm_reads_them(qtype: str) -> None:
    """d (and dmin) at the offsets swarm's block table names, where the store checks them."""
    from swarm.runtime.weights.ggml import BLOCKS

    where = BLOCKS[qtype].halves
    rng = np.random.default_rng(3)
    d, dmin = _f16(rng), _f16(rng)
    zeros = np.zeros((N, 256), dtype=np.uint8)
    if qtype == "Q2_K":
        blocks = pack_q2_k(d, dmin, np.ones((N, 16)), np.ones((N, 16)), zeros)
    elif qtype == "Q3_K":
        blocks = pack_q3_k(d, np.ones((N, 16)), zeros)
    else:
        blocks = pack_q5_k(d, dmin, np.ones((N, 8)), np.ones((N, 8)), zeros)
    assert blocks.shape[1] == BLOCKS[qtype].nbytes
    for value, at in zip((d, dmin), where, strict=False):
        got = np.ascontiguousarray(blocks[:, at : at + 2]).view(np.float16).reshape(N)
        np.testing.assert_array_equal(got.astype(np.float32), value)
