"""int8 symmetric quantization: one absmax scale per group of values, scale = absmax / 127,
q = round(value / scale). No codebook, no zero point.

Optionally each block of 64 values is first rotated by a fixed randomized Hadamard matrix
(R = diag(signs) @ H64 / 8, orthogonal; the decoder applies R's transpose). Hidden states of
small models carry a few "massive" channels, hundreds of times larger than the rest; with a
plain absmax scale, such a channel leaves the other 63 values of its block a handful of levels.
The rotation spreads every channel over the whole block first, which cuts the error of those
blocks several-fold (QuaRot, QuIP#). The payload then holds whole blocks, padding included.

Numpy rather than torch for the element-wise work: at one position a torch op costs several
microseconds of dispatch, a numpy op about one, and a decode-step frame is a few dozen of them.
Row maxima and the rotation go through torch, which is faster there and keeps to torch's
thread setting.
"""

from __future__ import annotations

import numpy as np
import torch

from swarm.errors import FrameError

BLOCK = 64
SCALE_BYTES = 4  # float32
_TINY = np.float32(np.finfo(np.float32).tiny)
# The largest scales a decoder accepts: 128 * scale stays finite in float32, and so does a
# rotated block's sum of 64 such values / 8.
_MAX_SCALE = np.float32(np.finfo(np.float32).max / 128)
_MAX_ROTATED_SCALE = np.float32(np.finfo(np.float32).max / 1024)


def _rotation() -> torch.Tensor:
    hadamard = np.array([[1.0]])
    for _ in range(6):
        hadamard = np.kron(hadamard, [[1.0, 1.0], [1.0, -1.0]])  # Sylvester: [64, 64] of +-1
    bits = 0x9E3779B97F4A7C15  # fixed forever: part of the codec's definition on the wire
    signs = np.array([-1.0 if bits >> i & 1 else 1.0 for i in range(BLOCK)])
    return torch.from_numpy((signs[:, None] * hadamard / 8).astype(np.float32))


ROTATION = _rotation()  # [64, 64], orthogonal; entries are +-1/8, exact in float32
UNROTATION = ROTATION.T.contiguous()


def stored_values(n: int, group: int, rotate: bool) -> int:
    """int8 values in the payload: n, or whole blocks when rotated."""
    return -(-n // group) * group if rotate else n


def payload_nbytes(n: int, group: int, rotate: bool) -> int:
    if n == 0:
        return 0
    return SCALE_BYTES * -(-n // group) + stored_values(n, group, rotate)


def quantize(values: np.ndarray, group: int, rotate: bool) -> np.ndarray:
    """values [n] float32 -> payload [4 * k + stored] uint8: k float32 scales, then int8s."""
    n = values.size
    out = np.empty(payload_nbytes(n, group, rotate), dtype=np.uint8)
    if n == 0:
        return out
    k = -(-n // group)
    if k * group != n:
        values = np.concatenate([values, np.zeros(k * group - n, dtype=np.float32)])
    blocks_t = torch.from_numpy(values.reshape(k, group))
    if rotate:
        blocks_t = blocks_t @ ROTATION
    blocks = blocks_t.numpy()  # [k, group]
    absmax = blocks_t.abs().amax(dim=1).numpy()  # [k]; NaN propagates
    # At least the smallest normal float32: a subnormal scale would lose the precision that
    # keeps |blocks / scale| <= 127 * (1 + 2**-23), which is why no clip is needed below.
    scales = np.maximum(absmax / np.float32(127), _TINY)
    if not scales.max() <= (_MAX_ROTATED_SCALE if rotate else _MAX_SCALE):  # False for NaN
        raise FrameError("cannot encode non-finite or out-of-range values as int8")
    q = blocks / scales[:, None]  # [k, group]
    np.rint(q, out=q)
    out[: SCALE_BYTES * k] = scales.view(np.uint8)
    stored = stored_values(n, group, rotate)
    np.copyto(out[SCALE_BYTES * k :].view(np.int8), q.reshape(-1)[:stored], casting="unsafe")
    return out


def dequantize(payload: np.ndarray, n: int, group: int, rotate: bool) -> np.ndarray:
    """payload [payload_nbytes] uint8 -> values [n] float32, freshly allocated."""
    if n == 0:
        return np.empty(0, dtype=np.float32)
    k = -(-n // group)
    scales = payload[: SCALE_BYTES * k].copy().view(np.float32)  # copied: 4-byte aligned
    limit = _MAX_ROTATED_SCALE if rotate else _MAX_SCALE
    if not (scales.min() >= 0 and scales.max() <= limit):  # False for NaN
        raise FrameError("int8 tensor has a negative, non-finite or out-of-range scale")
    values = np.zeros(k * group, dtype=np.float32)
    stored = stored_values(n, group, rotate)
    values[:stored] = payload[SCALE_BYTES * k :].view(np.int8)
    blocks = values.reshape(k, group)
    blocks *= scales[:, None]
    if rotate:
        values = (torch.from_numpy(blocks) @ UNROTATION).numpy().reshape(-1)
    return values[:n] if k * group != n else values
