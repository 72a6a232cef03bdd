"""The two products on packed GGUF blocks, as Triton kernels: y [rows, n] = x [rows, k] @ W.T,
W [n, k] kept as its blocks (uint8 [n, row bytes], as stored).

* `decode_kernel`, for 1..8 activation rows (a decode step, a short verify): each program
  dequantizes a tile of W's rows into registers and multiplies every activation row with it
  (float32 products and sums); W is read once, which is all a decode step costs.
* `prefill_kernel`, for more rows: tiles of W dequantized and fed to `tl.dot` in the
  activations' dtype (float32 as three TF32 products, "tf32x3"), float32 sums.

Both address a weight by its block: row n's block k // elements, index k % elements inside it
(`blocks.weights` decodes it). Rows, columns and activation rows need not be multiples of
the tiles: loads are masked."""

# Triton's kernel language is not annotated for mypy: pyproject.toml exempts this module.

from __future__ import annotations

import triton
import triton.language as tl

from swarm.runtime.gpu.blocks import weights


@triton.jit
def _weight_tile(w, table, rn, rk, n, k, row_bytes, QTYPE, ELEMENTS, NBYTES):
    """W's rows rn [BN] at columns rk [BK], float32 [BN, BK]."""
    m = (rn[:, None] < n) & (rk[None, :] < k)
    row = w + rn[:, None].to(tl.int64) * row_bytes
    b = row + (rk[None, :] // ELEMENTS) * NBYTES
    return weights(b, rk[None, :] % ELEMENTS, m, table, QTYPE)


@triton.jit
def decode_kernel(
    x, w, table, y, rows, n, k, row_bytes, x_stride, y_stride,
    QTYPE: tl.constexpr, ELEMENTS: tl.constexpr, NBYTES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, k, BLOCK_K):
        rk = start + tl.arange(0, BLOCK_K)
        tile = _weight_tile(w, table, rn, rk, n, k, row_bytes, QTYPE, ELEMENTS, NBYTES)
        xm = (rm[:, None] < rows) & (rk[None, :] < k)
        xs = tl.load(x + rm[:, None] * x_stride + rk[None, :], mask=xm, other=0.0)
        # [BM, 1, BK] * [1, BN, BK] summed over k: [BM, BN]
        acc += tl.sum(xs.to(tl.float32)[:, None, :] * tile[None, :, :], axis=2)
    ym = (rm[:, None] < rows) & (rn[None, :] < n)
    out = y + rm[:, None] * y_stride + rn[None, :]
    tl.store(out, acc.to(y.dtype.element_ty), mask=ym)


@triton.jit
def prefill_kernel(
    x, w, table, y, rows, n, k, row_bytes, x_stride, y_stride,
    QTYPE: tl.constexpr, ELEMENTS: tl.constexpr, NBYTES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, k, BLOCK_K):
        rk = start + tl.arange(0, BLOCK_K)
        tile = _weight_tile(w, table, rn, rk, n, k, row_bytes, QTYPE, ELEMENTS, NBYTES)
        xm = (rm[:, None] < rows) & (rk[None, :] < k)
        xs = tl.load(x + rm[:, None].to(tl.int64) * x_stride + rk[None, :], mask=xm, other=0.0)
        # [BM, BK] @ [BK, BN]; float32 as three TF32 products (about float32's accuracy)
        acc = tl.dot(xs, tl.trans(tile.to(xs.dtype)), acc, input_precision="tf32x3")
    ym = (rm[:, None] < rows) & (rn[None, :] < n)
    out = y + rm[:, None].to(tl.int64) * y_stride + rn[None, :]
    tl.store(out, acc.to(y.dtype.element_ty), mask=ym)


def grid(rows: int, n: int, block_m: int, block_n: int) -> tuple[int, int]:
    return (triton.cdiv(rows, block_m), triton.cdiv(n, block_n))
