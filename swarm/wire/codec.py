"""Tensor codecs: raw bytes in the tensor's own dtype, or int8 with one absmax scale per row or
per block of 64 values, optionally of Hadamard-rotated blocks (see quant.py).

Tensors travel as (dtype, shape, codec, bytes). Bytes are taken through a uint8 view, so
bfloat16 (which numpy lacks) travels like any other dtype, in the host's byte order: every
platform swarm targets (x86-64, aarch64) is little-endian. Decoding always copies into fresh,
writable memory, never a view of the frame's buffer.

int8 payload layout: float32 scales first (4-byte aligned in the fresh copy), then one int8
per element (per element of whole blocks, when rotated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import torch

from swarm.errors import FrameError
from swarm.wire.limits import WireLimits
from swarm.wire.quant import BLOCK, dequantize, payload_nbytes, quantize


class Codec(IntEnum):
    """How a tensor's values are packed. Append only: the numbers are on the wire."""

    RAW = 0
    INT8_ROW = 1  # one scale per row of the last dimension
    INT8_BLOCK64 = 2  # one scale per block of 64 consecutive values (last block may be short)
    INT8_HADAMARD64 = 3  # INT8_BLOCK64 of each block times a fixed randomized Hadamard matrix


TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
_NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16}  # numpy has no bfloat16


@dataclass(frozen=True)
class EncodedTensor:
    dtype: str  # the dtype the tensor decodes to: float32, bfloat16 or float16
    shape: tuple[int, ...]
    codec: Codec
    data: memoryview  # the payload: expected_nbytes(dtype, shape, codec) bytes


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _group(shape: tuple[int, ...], codec: Codec) -> int:
    """Values that share one scale."""
    if codec is Codec.INT8_ROW:
        return shape[-1] if shape else 1
    return BLOCK


def scale_count(shape: tuple[int, ...], codec: Codec) -> int:
    n = numel(shape)
    if codec is Codec.RAW or n == 0:
        return 0
    return -(-n // _group(shape, codec))


def expected_nbytes(dtype: str, shape: tuple[int, ...], codec: Codec) -> int:
    n = numel(shape)
    if codec is Codec.RAW:
        return n * TORCH_DTYPES[dtype].itemsize
    return payload_nbytes(n, _group(shape, codec), codec is Codec.INT8_HADAMARD64)


def check_spec(dtype: str, shape: tuple[int, ...], codec: Codec, limits: WireLimits) -> int:
    """Check a tensor's description against the limits; its payload size in bytes."""
    if dtype not in limits.allowed_dtypes:
        raise FrameError(f"tensor dtype {dtype!r} is not allowed")
    if len(shape) > limits.max_rank:
        raise FrameError(f"tensor rank {len(shape)} is over the limit of {limits.max_rank}")
    if any(d < 0 for d in shape):
        raise FrameError(f"tensor shape {list(shape)} has a negative dimension")
    # each dimension on its own too: (0, 2**64 - 1) holds no element, yet no tensor has it
    if any(d > limits.max_tensor_elements for d in shape):
        raise FrameError(
            f"tensor shape {list(shape)} has a dimension over {limits.max_tensor_elements}"
        )
    elements = numel(shape)
    if elements > limits.max_tensor_elements:
        raise FrameError(
            f"tensor of {elements} elements is over the limit of {limits.max_tensor_elements}"
        )
    return expected_nbytes(dtype, shape, codec)


def encode_tensor(tensor: torch.Tensor, codec: Codec = Codec.RAW) -> EncodedTensor:
    """Pack a floating-point tensor (any device) for the wire. Cast it first to send another
    dtype raw; int8 decodes back to the tensor's own dtype. A raw payload shares the tensor's
    memory until it is framed."""
    dtype = DTYPE_NAMES.get(tensor.dtype)
    if dtype is None:
        raise FrameError(f"cannot send a {tensor.dtype} tensor: use one of {list(TORCH_DTYPES)}")
    shape = tuple(tensor.shape)
    if (
        codec is Codec.RAW
        and dtype != "bfloat16"  # numpy has no bfloat16
        and tensor.device.type == "cpu"
        and not tensor.requires_grad
        and tensor.is_contiguous()
        and 0 not in shape  # a memoryview of no elements does not cast
    ):  # a decode step's rows, as computed: one torch call, where a frame's Python is paid
        # cold (after a hop's layers, 11 us here against 22 through reshape and view)
        return EncodedTensor(dtype, shape, codec, tensor.numpy().data.cast("B"))
    flat = tensor.detach().to("cpu").reshape(-1)  # [n]
    if flat.numel() == 0:  # an empty tensor may have stride 0, which view(uint8) refuses
        return EncodedTensor(dtype, shape, codec, memoryview(b""))
    if codec is Codec.RAW:
        return EncodedTensor(dtype, shape, codec, flat.contiguous().view(torch.uint8).numpy().data)
    values = flat.numpy() if flat.dtype == torch.float32 else flat.float().numpy()
    payload = quantize(values, _group(shape, codec), codec is Codec.INT8_HADAMARD64)
    return EncodedTensor(dtype, shape, codec, payload.data)


def decode_tensor(encoded: EncodedTensor) -> torch.Tensor:
    """Unpack a tensor whose spec passed check_spec, into fresh writable CPU memory."""
    dtype = TORCH_DTYPES[encoded.dtype]
    shape = encoded.shape
    expected = expected_nbytes(encoded.dtype, shape, encoded.codec)
    if len(encoded.data) != expected:
        raise FrameError(f"tensor payload is {len(encoded.data)} bytes, expected {expected}")
    if expected == 0:
        return torch.empty(shape, dtype=dtype)
    if encoded.codec is Codec.RAW:  # a fresh, writable copy, viewed in place
        if encoded.dtype in _NUMPY_DTYPES:  # one torch call: cold, 10 us against 26 for two
            values = np.frombuffer(bytearray(encoded.data), _NUMPY_DTYPES[encoded.dtype])
            return torch.from_numpy(values.reshape(shape))
        return torch.frombuffer(bytearray(encoded.data), dtype=dtype).view(shape)
    payload = np.frombuffer(encoded.data, dtype=np.uint8)  # [nbytes], read-only view
    group, rotate = _group(shape, encoded.codec), encoded.codec is Codec.INT8_HADAMARD64
    out = torch.from_numpy(dequantize(payload, numel(shape), group, rotate))
    return (out if dtype == torch.float32 else out.to(dtype)).reshape(shape)
