"""swarm's block kernels (swarm/runtime/weights/kernels/blocks.c): for every GGUF block type
the product from the blocks as stored is the product of their exact dequantization, up to the
activations' documented rounding; a row's result depends neither on its batch nor on the
thread count; the matrix holds the file's bytes and nothing more."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.block_bytes import (
    BYTE_GROUP_ROWS,
    KQUANT_ROWS,
    assert_rows_ignore_batch_and_threads,
    bytes_rounded,
    kquant_rounded,
    random_blocks,
)
from swarm.runtime.weights import ggml, native
from swarm.runtime.weights.blocks import NativeBlockMatrix
from swarm.runtime.weights.packed import Matrices, NativeQ4Matrix, PackedTensor

pytestmark = pytest.mark.skipif(
    not native.available(), reason="swarm's kernels are not built for this CPU"
)
ALL = sorted(ggml.BLOCKS)


# the block types whose block kernel takes 8-bit activations per group of 32 (byte_rows.h;
# Q4_1 runs as the 4-bit groups, not as blocks)
BYTE_BLOCK_ROWS = ("Q4_0", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL")


def _packed(qtype: str, rows: int, cols: int, seed: int = 0) -> PackedTensor:
    elements = ggml.BLOCKS[qtype].elements
    raw = random_blocks(np.random.default_rng(seed), rows * cols // elements, qtype)
    return PackedTensor(qtype, torch.from_numpy(raw.reshape(rows, -1)), cols)


def _lossless(batch: int, cols: int, seed: int = 1, qtype: str = "Q8_0") -> torch.Tensor:
    """Activations that the kernels' rounding keeps exactly: integers times 2^-20 with the
    largest at every rounding's span, so every step is 2^-20: int16 per group of 32, or int8
    per block of 256 for the K-quant rows and per group of 32 for the byte rows'."""
    g = torch.Generator().manual_seed(seed)
    most, span = (
        (127, 256)
        if qtype in KQUANT_ROWS
        else (127, 32)
        if qtype in BYTE_BLOCK_ROWS
        else (32767, 32)
    )
    q = torch.randint(-most, most + 1, (batch, cols // span, span), generator=g)
    q[..., 5] = most
    return (q.double() * 2.0**-20).float().view(batch, cols)


@pytest.mark.parametrize("qtype", ALL)
def test_the_product_is_the_exact_dequantization_s(qtype: str) -> None:
    # two rows of blocks, or 19 groups of 32 for the 32-wide types (an odd, unpaired group)
    cols = 512 if ggml.BLOCKS[qtype].elements == 256 else 32 * 19
    packed = _packed(qtype, rows=70, cols=cols)
    matrix = NativeBlockMatrix(packed.qtype, packed.data, packed.cols)
    assert matrix.nbytes == packed.nbytes  # the blocks as stored
    exact_w = packed.dequantize().double()
    x = _lossless(5, cols, qtype=qtype)
    want = x.double() @ exact_w.T
    got = matrix.matmul(x).double()
    # nothing but float32 sums between them: scales, codes and activations are exact
    assert (got - want).abs().max() <= 1e-6 * want.abs().max()
    x = torch.randn(3, cols)
    exact = x.double() @ exact_w.T
    # int16 activations per group of 32: ~1.5e-5 of each group's largest; int8 per block of
    # 256 or group of 32: 0.5-0.9% of these products of random blocks and values
    bound = 2e-2 if qtype in KQUANT_ROWS + BYTE_GROUP_ROWS else 1e-4
    assert (matrix.matmul(x).double() - exact).norm() <= bound * exact.norm()


@pytest.mark.parametrize("qtype", KQUANT_ROWS)
@pytest.mark.parametrize("batch", [1, 5])  # one row as bytes, a batch in quads
def test_k_quant_rows_multiply_the_activations_rounded_per_block(qtype: str, batch: int) -> None:
    packed = _packed(qtype, rows=70, cols=1024, seed=3)
    matrix = NativeBlockMatrix(packed.qtype, packed.data, packed.cols)
    x = torch.randn(batch, 1024) * 3
    want = kquant_rounded(x).double() @ packed.dequantize().double().T
    got = matrix.matmul(x).double()
    assert (got - want).abs().max() <= 1e-6 * want.abs().max()


@pytest.mark.parametrize("qtype", BYTE_BLOCK_ROWS)
@pytest.mark.parametrize("cols", [32 * 16, 32 * 17, 32 * 18, 32 * 19])  # quads, and 1-3 after
@pytest.mark.parametrize("batch", [1, 6, 11])  # 11: a batch of 8 and what is left
def test_byte_block_rows_multiply_the_activations_rounded_per_group(
    qtype: str, cols: int, batch: int
) -> None:
    packed = _packed(qtype, rows=70, cols=cols, seed=3)
    matrix = NativeBlockMatrix(packed.qtype, packed.data, packed.cols)
    x = torch.randn(batch, cols) * 3
    want = bytes_rounded(x, 32).double() @ packed.dequantize().double().T
    got = matrix.matmul(x).double()
    assert (got - want).abs().max() <= 1e-6 * want.abs().max()


@pytest.mark.parametrize("qtype", KQUANT_ROWS + BYTE_BLOCK_ROWS + ("IQ2_XS",))
@pytest.mark.parametrize("cols", [512, 8192])  # 8192: one row's output rows two side by side
def test_a_row_depends_neither_on_its_batch_nor_on_the_threads(qtype: str, cols: int) -> None:
    packed = _packed(qtype, rows=200, cols=cols, seed=2)  # 200: not a multiple of 64 rows
    matrix = NativeBlockMatrix(packed.qtype, packed.data, packed.cols)
    assert_rows_ignore_batch_and_threads(matrix, torch.randn(7, cols))  # tiles of 4 and 3


def test_q6_k_at_its_extremes_gives_one_row_the_bits_of_a_batch() -> None:
    # one activation row takes Q6_K's codes as stored (0..63) and the 32 off per quad, a batch
    # the biased form: codes 0 and 63 under scales -128 and 127 against activations at +-127
    # keep every pair and lane within its integers, so both are exact and agree
    blocks = np.zeros((4, 4, 210), dtype=np.uint8)  # 4 rows of 1024 columns
    blocks[..., 208:210] = np.frombuffer(np.float16(2.0**-8).tobytes(), dtype=np.uint8)
    blocks[1::2, :, :192] = 0xFF  # every code 63 in rows 1 and 3, 0 in rows 0 and 2
    scales = np.where(np.arange(16) % 2, 127, -128).astype(np.int8).view(np.uint8)
    blocks[..., 192:208] = scales
    blocks[2:, :, 192:208] = scales[::-1]
    packed = PackedTensor("Q6_K", torch.from_numpy(blocks.reshape(4, -1)), 1024)
    matrix = NativeBlockMatrix(packed.qtype, packed.data, packed.cols)
    x = _lossless(6, 1024, qtype="Q6_K")
    x[:2] = x[:2].sign() * x[:2].abs().amax()  # every activation at +-127 steps
    x[1] = x[1].abs()
    want = x.double() @ packed.dequantize().double().T
    assert (matrix.matmul(x).double() - want).abs().max() <= 1e-6 * want.abs().max()
    assert_rows_ignore_batch_and_threads(matrix, x)


def test_rows_of_blocks_not_a_multiple_of_256_run() -> None:
    # Gemma-3 270M's width: llama.cpp's Q4_K_M writes its matrices as Q5_0 and Q8_0
    for qtype in ("Q5_0", "Q8_0", "IQ4_NL"):
        packed = _packed(qtype, rows=64, cols=640)
        x = _lossless(2, 640, qtype=qtype)
        want = x.double() @ packed.dequantize().double().T
        got = Matrices(torch.device("cpu")).fused([packed]).matmul(x).double()
        assert (got - want).abs().max() <= 1e-6 * want.abs().max()


@pytest.mark.parametrize("qtype", ALL)
def test_packed_matrices_run_on_the_block_kernels(qtype: str) -> None:
    matrix = Matrices(torch.device("cpu")).fused([_packed(qtype, rows=32, cols=256)])
    kind = NativeQ4Matrix if qtype == "Q4_1" else NativeBlockMatrix
    assert isinstance(matrix, kind)


@pytest.mark.skipif(
    not (native.available() and native.use_wide(True)), reason="this CPU has no AVX-512 VNNI"
)
@pytest.mark.parametrize("qtype", ALL)
def test_the_avx512_rows_give_the_avx2_rows_bits(qtype: str) -> None:
    cols = 512 if ggml.BLOCKS[qtype].elements == 256 else 32 * 19  # 32 * 19: a last lone group
    _same_bits_on_both_rows(qtype, cols)


@pytest.mark.skipif(
    not (native.available() and native.use_wide(True)), reason="this CPU has no AVX-512 VNNI"
)
@pytest.mark.parametrize("qtype", KQUANT_ROWS + BYTE_BLOCK_ROWS)
def test_long_rows_side_by_side_give_the_avx2_rows_bits(qtype: str) -> None:
    _same_bits_on_both_rows(qtype, 8192)


def _same_bits_on_both_rows(qtype: str, cols: int) -> None:
    packed = _packed(qtype, rows=131, cols=cols, seed=4)
    matrix = NativeBlockMatrix(packed.qtype, packed.data, packed.cols)
    try:
        for batch in (1, 3, 8, 11, 17):  # tiles of 8 (AVX-512) or 4 (AVX2), and the rest
            x = torch.randn(batch, cols) * 4
            native.use_wide(False)
            narrow = matrix.matmul(x)
            native.use_wide(True)
            assert torch.equal(narrow, matrix.matmul(x)), (qtype, batch)
    finally:
        native.use_wide(True)


def test_no_kernel_reads_past_a_matrix_s_last_block() -> None:
    # each type's blocks end where an unreadable page begins (harness.guard_page): a read past
    # them faults, in a child process so that it fails this test alone
    run = subprocess.run(
        [sys.executable, "-m", "harness.guard_page"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert run.returncode == 0, f"faulted after: {run.stdout!r} {run.stderr[-500:]!r}"
    assert run.stdout.count(" ok") == len(ggml.BLOCKS), run.stdout
