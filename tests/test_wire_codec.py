"""Tensor codecs: exact raw round trips for every dtype and shape, int8 error bounds, limits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from swarm.errors import FrameError
from swarm.wire.codec import (
    Codec,
    EncodedTensor,
    check_spec,
    decode_tensor,
    encode_tensor,
    expected_nbytes,
    scale_count,
)
from swarm.wire.limits import WireLimits
from swarm.wire.quant import BLOCK, ROTATION

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(), (0,), (1, 0, 576), (3, 0), (1,), (1, 1, 576), (2, 3, 5), (1, 7, 130), (1, 2, 4096)]
SLOW = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])


def _random(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * 3).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits, so the comparison is exact (and NaN-safe) for every dtype."""
    if t.numel() == 0:  # an empty tensor may have stride 0, which view(uint8) refuses
        return torch.empty(0, dtype=torch.uint8)
    return t.contiguous().reshape(-1).view(torch.uint8)


def _roundtrip(t: torch.Tensor, codec: Codec) -> torch.Tensor:
    enc = encode_tensor(t, codec)
    # What the frame decoder does: a copy of the payload bytes, nothing shared with the sender.
    return decode_tensor(
        EncodedTensor(enc.dtype, enc.shape, enc.codec, memoryview(bytes(enc.data)))
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_raw_round_trip_is_bit_exact(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    t = _random(shape, dtype)
    out = _roundtrip(t, Codec.RAW)
    assert out.dtype == dtype and tuple(out.shape) == shape
    assert torch.equal(_bits(out), _bits(t))


def _error_bound(t: torch.Tensor, codec: Codec) -> torch.Tensor:
    """Per element: half a quantization step of its group, plus rounding to t's dtype. A
    rotated block's error is bounded through the rotation: |R^T e| <= 64 * (step / 2) / 8."""
    shape = tuple(t.shape)
    group = (shape[-1] if shape else 1) if codec is Codec.INT8_ROW else BLOCK
    x = t.float().reshape(-1)
    blocks = torch.nn.functional.pad(x, (0, -x.numel() % group)).view(-1, group)
    if codec is Codec.INT8_HADAMARD64:
        blocks = blocks @ ROTATION
    step = blocks.abs().amax(dim=1, keepdim=True) / 127
    half = step / 2 * (4 * 2 if codec is Codec.INT8_HADAMARD64 else 1)
    half = half.expand_as(blocks).reshape(-1)[: x.numel()]
    eps = torch.finfo(t.dtype).eps
    return half * (1 + 1e-5) + x.abs() * eps + step.max() * eps * 127 + 1e-30


INT8 = [Codec.INT8_ROW, Codec.INT8_BLOCK64, Codec.INT8_HADAMARD64]


@pytest.mark.parametrize("codec", INT8)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_int8_round_trip_within_half_a_step(
    codec: Codec, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    t = _random(shape, dtype, seed=1)
    out = _roundtrip(t, codec)
    assert out.dtype == dtype and tuple(out.shape) == shape
    if t.numel():
        error = (out.float() - t.float()).reshape(-1).abs()
        assert bool((error <= _error_bound(t, codec)).all())


def test_rotation_is_orthogonal_and_exact() -> None:
    assert torch.equal(ROTATION @ ROTATION.T, torch.eye(64))
    assert set(ROTATION.abs().unique().tolist()) == {0.125}


def test_rotation_tames_outlier_channels() -> None:
    # Like a small model's residual stream: one "massive" channel, hundreds of times the rest.
    t = _random((1, 32, 576), torch.float32, seed=2)
    t[..., 507] *= 300
    errors = {
        codec: float((_roundtrip(t, codec) - t).norm() / t[..., :448].norm()) for codec in INT8
    }
    assert errors[Codec.INT8_HADAMARD64] < errors[Codec.INT8_BLOCK64] / 3
    assert errors[Codec.INT8_BLOCK64] < errors[Codec.INT8_ROW] / 3


def test_int8_reproduces_values_on_its_grid_exactly() -> None:
    q = torch.randint(-127, 128, (4, 64)).float()
    q[:, 0] = 127  # every block's absmax is 127 steps of its scale
    scales = torch.tensor([[0.5], [2.0**-10], [8.0], [1.0]])
    t = (q * scales).reshape(1, 4, 64)
    for codec in (Codec.INT8_ROW, Codec.INT8_BLOCK64):  # not rotated: the grid is the input's
        assert torch.equal(_roundtrip(t, codec), t)


def test_int8_zero_blocks_and_partial_last_block() -> None:
    t = torch.zeros(1, 1, 130)
    t[0, 0, 128:] = torch.tensor([3.0, -127.0])  # only the third, short block is non-zero
    enc = encode_tensor(t, Codec.INT8_BLOCK64)
    assert len(enc.data) == 130 + 4 * 3
    assert torch.equal(_roundtrip(t, Codec.INT8_BLOCK64), t)
    assert len(encode_tensor(t, Codec.INT8_HADAMARD64).data) == 3 * 64 + 4 * 3  # whole blocks
    assert torch.equal(_roundtrip(torch.zeros(1, 1, 130), Codec.INT8_HADAMARD64), t * 0)


def test_payload_sizes_and_the_int8_ratio() -> None:
    shape = (1, 1, 4096)
    assert expected_nbytes("float16", shape, Codec.RAW) == 8192
    assert expected_nbytes("float32", shape, Codec.INT8_ROW) == 4096 + 4
    assert expected_nbytes("bfloat16", shape, Codec.INT8_BLOCK64) == 4096 + 4 * 64
    assert scale_count((2, 3, 5), Codec.INT8_ROW) == 6
    assert scale_count((0, 5), Codec.INT8_BLOCK64) == 0
    assert expected_nbytes("float32", shape, Codec.INT8_BLOCK64) / 8192 < 0.55
    assert expected_nbytes("float32", (5, 70), Codec.INT8_HADAMARD64) == 6 * 64 + 4 * 6
    for codec in Codec:
        enc = encode_tensor(torch.randn(shape), codec)
        assert len(enc.data) == expected_nbytes("float32", shape, codec)


def test_decoded_tensors_own_writable_memory() -> None:
    for codec in Codec:
        payload = bytearray(encode_tensor(torch.ones(1, 2, 64), codec).data)
        enc = EncodedTensor("float32", (1, 2, 64), codec, memoryview(payload))
        out = decode_tensor(enc)
        before = bytes(payload)
        out.add_(1)  # would warn or fail on read-only memory
        assert bytes(payload) == before
        assert torch.allclose(out, torch.full((1, 2, 64), 2.0), atol=0.02)


def test_non_contiguous_and_grad_tensors_encode() -> None:
    base = torch.randn(4, 6, requires_grad=True)
    t = base.t()  # non-contiguous view with grad
    assert torch.equal(_roundtrip(t, Codec.RAW), t.detach())


def test_encode_refuses_other_dtypes_and_non_finite_int8() -> None:
    with pytest.raises(FrameError, match="cannot send"):
        encode_tensor(torch.arange(4), Codec.RAW)
    for bad in (float("nan"), float("inf")):
        t = torch.ones(1, 1, 64)
        t[0, 0, 3] = bad
        for codec in INT8:
            with pytest.raises(FrameError, match="non-finite"):
                encode_tensor(t, codec)
    aligned = ROTATION[:, 0] * 8 * 3e38  # finite, but rotates to 8 * 3e38 = inf
    with pytest.raises(FrameError, match="out-of-range"):
        encode_tensor(aligned, Codec.INT8_HADAMARD64)
    nan = torch.full((1, 1, 4), float("nan"))
    assert torch.isnan(_roundtrip(nan, Codec.RAW)).all()  # raw sends what it is given


def test_decode_refuses_bad_scales_and_wrong_sizes() -> None:
    for codec, big in ((Codec.INT8_BLOCK64, 1e38), (Codec.INT8_HADAMARD64, 1e36)):
        enc = encode_tensor(torch.randn(1, 1, 128), codec)
        for scale in (-1.0, float("nan"), float("inf"), big):
            payload = bytearray(enc.data)
            payload[:4] = np.float32(scale).tobytes()
            with pytest.raises(FrameError, match="scale"):
                decode_tensor(EncodedTensor(enc.dtype, enc.shape, codec, memoryview(payload)))
    short = EncodedTensor(enc.dtype, enc.shape, enc.codec, enc.data[:-1])
    with pytest.raises(FrameError, match="bytes"):
        decode_tensor(short)


def test_check_spec_enforces_limits() -> None:
    limits = WireLimits(max_rank=3, max_tensor_elements=1000, allowed_dtypes=frozenset({"float16"}))
    assert check_spec("float16", (1, 10, 100), Codec.RAW, limits) == 2000
    with pytest.raises(FrameError, match="not allowed"):
        check_spec("float32", (1,), Codec.RAW, limits)
    with pytest.raises(FrameError, match="rank"):
        check_spec("float16", (1, 1, 1, 1), Codec.RAW, limits)
    with pytest.raises(FrameError, match="elements"):
        check_spec("float16", (1, 11, 100), Codec.RAW, limits)
    with pytest.raises(FrameError, match="over 1000"):
        check_spec("float16", (2**62, 2**62, 2**62), Codec.RAW, limits)
    with pytest.raises(FrameError, match="over 1000"):  # no element, yet no tensor is that big
        check_spec("float16", (0, 2**64 - 1), Codec.RAW, limits)
    with pytest.raises(FrameError, match="negative"):
        check_spec("float16", (1, -1), Codec.RAW, limits)


@SLOW
@given(
    hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=70),
        elements=st.floats(-(2.0**100), 2.0**100, width=32),
    ),
    st.sampled_from(list(Codec)),
)
def test_property_round_trip(values: np.ndarray, codec: Codec) -> None:
    t = torch.from_numpy(values.copy())
    out = _roundtrip(t, codec)
    assert tuple(out.shape) == values.shape
    if codec is Codec.RAW:
        assert torch.equal(_bits(out), _bits(t))
    elif t.numel():
        assert bool(((out - t).reshape(-1).abs() <= _error_bound(t, codec)).all())
        if codec is not Codec.INT8_HADAMARD64:
            assert bool((out[t == 0] == 0).all())  # exact where the tensor is zero
