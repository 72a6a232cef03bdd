"""Random valid GGUF blocks of any type: random bytes (every code pattern is valid) with finite,
small float16 scales written where the type keeps them. The `gguf` package quantizes only the
legacy types; this makes blocks of every other one for tests and fixtures. Also the check every
kernel's test makes: a row's bits do not depend on its batch or the thread count."""

from __future__ import annotations

import numpy as np
import torch

from swarm.runtime.weights import ggml
from swarm.runtime.weights.quant import Matrix


def random_blocks(
    rng: np.random.Generator, n: int, qtype: str, scale: tuple[float, float] = (1e-3, 1e-2)
) -> np.ndarray:
    """uint8 [n, block bytes]: n random blocks of `qtype`, scales uniform in `scale`."""
    kind = ggml.BLOCKS[qtype]
    raw = rng.integers(0, 256, (n, kind.nbytes), dtype=np.uint8)
    d = rng.uniform(*scale, (n, 1)).astype(np.float16)
    for at in kind.halves:
        raw[:, at : at + 2] = d.view(np.uint8)
    if qtype == "MXFP4":  # an E8M0 exponent: the power of two nearest d, halved
        raw[:, 0] = np.round(np.log2(d.astype(np.float32)[:, 0])).astype(np.int32) + 128
    if qtype == "IQ1_M":  # the scale's four nibbles, on top of the four 16-bit scale words
        words = raw[:, 48:56].copy().view(np.uint16)
        bits = d.view(np.uint16)[:, 0]
        for j in range(4):
            words[:, j] = (words[:, j] & 0x0FFF) | (((bits >> (4 * j)) & 0xF) << 12)
        raw[:, 48:56] = words.view(np.uint8)
    return raw


def set_scale(raw: np.ndarray, qtype: str, block: int, value: float) -> None:
    """Write `value` as the float16 scale of block `block` (its first scale field)."""
    kind = ggml.BLOCKS[qtype]
    half = np.array([value], dtype=np.float16)
    if qtype == "IQ1_M":
        words = raw[block, 48:56].copy().view(np.uint16)
        bits = int(half.view(np.uint16)[0])
        for j in range(4):
            words[j] = (words[j] & 0x0FFF) | (((bits >> (4 * j)) & 0xF) << 12)
        raw[block, 48:56] = words.view(np.uint8)
    else:
        at = kind.halves[0]
        raw[block, at : at + 2] = half.view(np.uint8)


def assert_rows_ignore_batch_and_threads(matrix: Matrix, x: torch.Tensor) -> None:
    """Each row of x through `matrix` alone on one thread gives the bits it gets within the
    whole batch on two (failover replays and the exact-match tests rely on it)."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together = matrix.matmul(x)
        torch.set_num_threads(1)
        alone = [matrix.matmul(x[i : i + 1])[0] for i in range(x.shape[0])]
    finally:
        torch.set_num_threads(threads)
    for i, row in enumerate(alone):
        assert torch.equal(row, together[i]), i


# types whose rows take 8-bit activations per 256 (kernels/kquant_rows.h)
KQUANT_ROWS = (
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_XS",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ3_XXS",
    "IQ3_S",
    "IQ1_S",
    "IQ1_M",
)
# types whose rows take 8-bit activations per group of 32 (kernels/byte_rows.h)
BYTE_GROUP_ROWS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL")


def bytes_rounded(x: torch.Tensor, span: int) -> torch.Tensor:
    """x as swarm's 8-bit rows take it: each `span` values rounded to -127..127 times absmax /
    127, in float32 as the kernels round (the product of that with the dequantized blocks is
    theirs, up to float32 sums)."""
    blocks = x.float().reshape(*x.shape[:-1], -1, span)
    step = blocks.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(step > 0, 1 / step, torch.zeros_like(step))
    return ((blocks * inverse).round().clamp(-127, 127) * step).reshape(x.shape).to(x.dtype)


def kquant_rounded(x: torch.Tensor) -> torch.Tensor:
    """x as swarm's K-quant rows take it (kernels/kquant_rows.h): per block of 256."""
    return bytes_rounded(x, 256)


def rows_rounded(x: torch.Tensor, qtype: str) -> torch.Tensor:
    """x as the native rows of `qtype` take it: per 256 (K-quant rows), per 32 (Q4_0, Q4_1,
    Q5_0, Q5_1, Q8_0), else unchanged (16 bits per group of 32: within ~1e-5 of it)."""
    if qtype in KQUANT_ROWS:
        return bytes_rounded(x, 256)
    if qtype in BYTE_GROUP_ROWS:
        return bytes_rounded(x, 32)
    return x
