"""Every GGUF block type swarm runs, dequantized in torch (swarm.runtime.weights.dequant) and
compared with the `gguf` package's numpy dequantizers bit for bit, on random valid blocks; and
the scale check the store runs on every block."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.block_bytes import random_blocks, set_scale
from swarm.runtime.weights import dequant, dequant_grid, ggml

ALL = sorted(ggml.BLOCKS)


def _blocks(qtype: str, rows: int, per_row: int, seed: int = 0) -> np.ndarray:
    raw = random_blocks(np.random.default_rng(seed), rows * per_row, qtype)
    if qtype == "IQ1_M":
        # gguf-py's IQ1_M always subtracts its delta (`qh & 0x08 == 0` reads as
        # `qh & False`); ggml subtracts it only where the bit is set, so the two agree on
        # blocks whose bits are all set. The other case is checked against ggml below.
        raw[:, 32:48] |= 0x88
    return raw.reshape(rows, -1)


def test_block_sizes_are_ggml_s() -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    for qtype, kind in ggml.BLOCKS.items():
        assert GGML_QUANT_SIZES[GGMLQuantizationType[qtype]] == (kind.elements, kind.nbytes)
    assert set(dequant.DECODERS) == set(ggml.BLOCKS)


@pytest.mark.parametrize("qtype", ALL)
def test_dequantizing_matches_gguf_bit_for_bit(qtype: str) -> None:
    from gguf import GGMLQuantizationType, dequantize

    raw = _blocks(qtype, rows=7, per_row=3)
    cols = 3 * ggml.BLOCKS[qtype].elements
    want = torch.from_numpy(dequantize(raw, GGMLQuantizationType[qtype]))
    got = dequant.dequantize(qtype, torch.from_numpy(raw), cols)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    as_bf16 = dequant.dequantize(qtype, torch.from_numpy(raw), cols, torch.bfloat16)
    assert torch.equal(as_bf16, want.to(torch.bfloat16))


def test_slices_of_rows_give_the_whole_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = torch.from_numpy(_blocks("Q6_K", rows=9, per_row=2))
    whole = dequant.dequantize("Q6_K", raw, 512)
    monkeypatch.setattr(dequant, "_SLICE_ELEMENTS", 1000)  # two rows a slice, then one
    assert torch.equal(dequant.dequantize("Q6_K", raw, 512), whole)


def test_iq1_m_adds_its_delta_where_the_bit_is_clear() -> None:
    raw = _blocks("IQ1_M", rows=1, per_row=1)
    raw[0, 32] = 0x00  # the first two groups of 8: bit 3 clear, grid index high bits 0
    got = dequant.dequantize("IQ1_M", torch.from_numpy(raw), 256)[0]
    words = raw[0, 48:56].view(np.uint16).astype(np.int64)
    bits = (words[0] >> 12) | ((words[1] >> 8) & 0xF0) | ((words[2] >> 4) & 0xF00)
    bits |= words[3] & 0xF000
    d = np.array([bits], dtype=np.uint16).view(np.float16).astype(np.float32)[0]
    dl = d * np.float32(2 * (words[0] & 7) + 1)
    grid = dequant_grid.grid("IQ1_M")[int(raw[0, 0])].numpy()
    want = dl * (grid + np.float32(0.125))  # ggml-quants.c's dequantize_row_iq1_m
    np.testing.assert_array_equal(got[:8].numpy(), want)


@pytest.mark.parametrize("qtype", [q for q in ALL if q != "MXFP4"])
def test_a_block_with_a_scale_that_is_not_finite_is_found(qtype: str) -> None:
    raw = _blocks(qtype, rows=4, per_row=2)
    assert ggml.first_bad_block(qtype, torch.from_numpy(raw)) is None
    blocks = raw.reshape(8, -1)
    set_scale(blocks, qtype, 5, float("inf"))
    assert ggml.first_bad_block(qtype, torch.from_numpy(raw)) == 5
    set_scale(blocks, qtype, 2, float("nan"))
    assert ggml.first_bad_block(qtype, torch.from_numpy(raw)) == 2


def test_mxfp4_scales_are_powers_of_two_and_always_finite() -> None:
    """MXFP4's scale is an exponent byte: every value, 255 included, is a finite power of two
    (ggml's halved E8M0, as the gguf package reads it), so no block is ever refused."""
    from gguf import GGMLQuantizationType, dequantize

    raw = np.zeros((256, 17), dtype=np.uint8)
    raw[:, 0] = np.arange(256)
    raw[:, 1] = 0x01  # element 0: code 1 (the value 1, doubled); element 16: 0
    got = dequant.dequantize("MXFP4", torch.from_numpy(raw), 32)
    assert torch.equal(got, torch.from_numpy(dequantize(raw, GGMLQuantizationType.MXFP4)))
    assert torch.equal(got[:, 0], torch.exp2(torch.arange(256, dtype=torch.float64) - 128).float())
    assert ggml.first_bad_block("MXFP4", torch.from_numpy(raw)) is None


@pytest.mark.parametrize("qtype", ["Q5_1", "IQ3_S", "Q2_K"])
def test_other_devices_multiply_by_the_same_dequantization(qtype: str) -> None:
    from swarm.runtime.weights.packed import DequantMatrix, PackedTensor

    cols = 8 * ggml.BLOCKS[qtype].elements
    packed = PackedTensor(qtype, torch.from_numpy(_blocks(qtype, rows=16, per_row=8)), cols)
    x = torch.randn(3, cols)
    want = torch.nn.functional.linear(x, packed.dequantize())
    assert torch.equal(DequantMatrix(packed).matmul(x), want)  # what CUDA nodes run
