"""swarm's compiled CPU kernels (swarm/runtime/weights/kernels/products.c): each computes exactly
the integer product it promises, a row's result depends neither on its batch nor on the thread
count, and a node without them runs torch's int4 and int8 kernels."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from harness.block_bytes import assert_rows_ignore_batch_and_threads
from harness.kquants import quantize_q4_k
from swarm.runtime.weights import ggml, native
from swarm.runtime.weights.packed import Int4Matrix, Matrices, NativeQ4Matrix, PackedTensor
from swarm.runtime.weights.quant import Int8Weight

needs_kernel = pytest.mark.skipif(
    not native.available(), reason="swarm's 4-bit kernel is not built for this CPU"
)


def _blocks(qtype: str, rows: int, cols: int, seed: int = 0) -> PackedTensor:
    from gguf import GGMLQuantizationType, quantize

    weights = np.random.default_rng(seed).normal(0, 0.05, (rows, cols)).astype(np.float32)
    if qtype == "Q4_K":
        raw = quantize_q4_k(weights)
    else:
        raw = quantize(weights, GGMLQuantizationType[qtype])
    return PackedTensor(qtype, torch.from_numpy(raw).reshape(rows, -1), cols)


def _rounded_activations(x: torch.Tensor, most: int = 32767) -> tuple[torch.Tensor, torch.Tensor]:
    """x [batch, cols] as the kernels round it per group of 32: integer values
    [batch, groups, 32] within -most..most, and each group's step (absmax / most): int16 for
    the int8 rows, 8 bits (most 127) for the 4-bit rows."""
    groups = x.view(x.shape[0], -1, 32)
    step = groups.abs().amax(-1) / float(most)
    inverse = torch.where(step > 0, 1.0 / step, torch.zeros_like(step))
    return torch.round(groups * inverse[..., None]).to(torch.int64), step


def _kernel_math(packed: PackedTensor, x: torch.Tensor) -> torch.Tensor:
    """What the 4-bit kernel computes, in float64: activations rounded to 8 bits per group of
    32, scales and offsets in float16, integer sums of codes times activations, the offsets
    times the sums of the rounded activations."""
    decoded = ggml.decode(packed.qtype, packed.data, packed.cols)
    rows, cols = packed.shape
    xq, step = _rounded_activations(x, most=127)
    codes = decoded.codes.to(torch.int64).view(rows, cols // 32, 32)
    dots = torch.einsum("rgi,bgi->brg", codes, xq).double()
    scale = decoded.scale.to(torch.float16).double()
    offset = decoded.offset.to(torch.float16).double()
    sums = xq.sum(-1).double() * step.double()
    return (dots * scale * step.double()[:, None, :]).sum(-1) + (sums @ offset.T)


@needs_kernel
@pytest.mark.parametrize(  # whole quads of groups; and a pair and a group after them
    "qtype, cols", [("Q4_0", 512), ("Q4_1", 512), ("Q4_1", 32 * 19), ("Q4_K", 512)]
)
def test_the_kernel_computes_its_integer_product(qtype: str, cols: int) -> None:
    packed = _blocks(qtype, rows=200, cols=cols)  # rows not a multiple of a thread's 64
    matrix = NativeQ4Matrix(packed)
    x = torch.randn(6, packed.cols)  # a batch not a multiple of the kernel's tile of 4
    got = matrix.matmul(x).double()
    want = _kernel_math(packed, x)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    # and it follows the dequantized matrix within its activations' rounding to 8 bits
    # (~4e-3 of the norm here, as llama.cpp's rounding for these blocks; torch's bfloat16
    # path is ~3e-3 off); Q4_K's scales (a product of two) round to float16 as well
    exact = x.double() @ packed.dequantize().double().T
    assert (got - exact).norm() <= 1e-2 * exact.norm()
    assert matrix.nbytes <= 1.12 * packed.nbytes  # codes plus two float16 per group


@needs_kernel
def test_the_int8_kernel_computes_its_integer_product() -> None:
    weights = torch.randn(130, 576) * 0.05  # the embedded model's width; 130 rows: not 64k
    matrix = Int8Weight.quantize(weights)
    assert matrix._native_scales is not None
    x = torch.randn(5, 576)
    got = matrix.matmul(x).double()
    xq, step = _rounded_activations(x)
    dots = torch.einsum("rgi,bgi->brg", matrix.values.to(torch.int64).view(130, -1, 32), xq)
    want = (dots.double() * step.double()[:, None, :]).sum(-1) * matrix.scales.double()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    alone = matrix.matmul(x[3:4])
    assert torch.equal(alone[0], matrix.matmul(x)[3])
    exact = x.double() @ matrix.dequantize().double().T
    assert (got - exact).norm() <= 1e-4 * exact.norm()


@needs_kernel
def test_a_row_depends_neither_on_its_batch_nor_on_the_threads() -> None:
    matrix = NativeQ4Matrix(_blocks("Q4_K", rows=300, cols=1024, seed=1))
    assert_rows_ignore_batch_and_threads(matrix, torch.randn(7, 1024))


@pytest.fixture
def kernel_off() -> Iterator[None]:
    with native.switched(native.KernelSwitches(native=False)):
        yield


def test_without_the_kernel_nodes_run_torch_int4(kernel_off: None) -> None:
    packed = _blocks("Q4_1", rows=64, cols=256)
    assert not native.available()
    assert native.kernel_name() == "torch"
    matrix = Matrices(torch.device("cpu")).fused([packed])
    assert isinstance(matrix, Int4Matrix)
    x = torch.randn(2, 256)
    want = x @ packed.dequantize().T
    assert (matrix.matmul(x) - want).abs().max() <= 0.02 * want.abs().max()
    eight_bit = Int8Weight.quantize(packed.dequantize())
    assert eight_bit._native_scales is None  # torch's _weight_int8pack_mm
    assert (eight_bit.matmul(x) - want).abs().max() <= 0.02 * want.abs().max()


@needs_kernel
def test_the_norm_and_rotary_steps_follow_torch_and_ignore_their_batch() -> None:
    from swarm.runtime.families.llama import _rotate_half, rms_norm

    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(5, 3, 584, generator=generator)  # width not a multiple of 8
    weight = torch.randn(584, generator=generator)
    normed = native.rms_norm(hidden, weight, 1e-5)
    assert torch.allclose(normed, rms_norm(hidden, weight, 1e-5), rtol=1e-5, atol=1e-6)
    assert torch.equal(native.rms_norm(hidden[2:3], weight, 1e-5), normed[2:3])

    heads = torch.randn(5, 3, 7, 64, generator=generator)  # 4 rotated heads of 7
    cos, sin = torch.randn(2, 5, 3, 64, generator=generator)
    want = heads.clone()
    qk = want[:, :, :4].transpose(1, 2)
    want[:, :, :4] = ((qk * cos[:, None]) + (_rotate_half(qk) * sin[:, None])).transpose(1, 2)
    got = heads.clone()
    native.rotate_(got, cos, sin, 4)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[:, :, 4:], heads[:, :, 4:])  # v untouched
    one = heads[1:2].clone()
    native.rotate_(one, cos[1:2], sin[1:2], 4)
    assert torch.equal(one, got[1:2])


needs_wide = pytest.mark.skipif(
    not (native.available() and native.use_wide(True)),
    reason="this CPU has no AVX-512 VNNI",
)


@pytest.fixture
def both_row_kernels() -> Iterator[Callable[[Callable[[], torch.Tensor]], list[torch.Tensor]]]:
    """Runs a product once on the AVX2 rows and once on the AVX-512 ones."""

    def run(product: Callable[[], torch.Tensor]) -> list[torch.Tensor]:
        outputs = []
        for wide in (False, True):
            native.use_wide(wide)
            outputs.append(product())
        return outputs

    yield run
    native.use_wide(True)


@needs_wide
@pytest.mark.parametrize(  # groups: 4 quads and a pair (18), and a pair and one (19), one
    # (17), none (48) after the last quad; Q4_K's blocks are 256 wide
    "qtype, cols",
    [
        ("Q4_0", 576),
        ("Q4_0", 32 * 19),
        ("Q4_1", 576),
        ("Q4_1", 32 * 19),
        ("Q4_1", 32 * 17),
        ("Q4_1", 32 * 3),
        ("Q4_K", 1536),
    ],
)
def test_the_avx512_rows_give_the_avx2_rows_bits(
    qtype: str,
    cols: int,
    both_row_kernels: Callable[[Callable[[], torch.Tensor]], list[torch.Tensor]],
) -> None:
    matrix = NativeQ4Matrix(_blocks(qtype, rows=131, cols=cols))
    for batch in (1, 3, 8, 11):  # tiles of 8 and what is left
        x = torch.randn(batch, cols) * 4
        narrow, wide = both_row_kernels(lambda x=x: matrix.matmul(x))
        assert torch.equal(narrow, wide), (qtype, cols, batch)


@needs_wide
@pytest.mark.parametrize("cols", [576, 32 * 19])
def test_the_avx512_int8_rows_give_the_avx2_rows_bits(
    cols: int, both_row_kernels: Callable[[Callable[[], torch.Tensor]], list[torch.Tensor]]
) -> None:
    matrix = Int8Weight.quantize(torch.randn(71, cols) * 0.05)
    for batch in (1, 5, 8, 13):
        x = torch.randn(batch, cols)
        narrow, wide = both_row_kernels(lambda x=x: matrix.matmul(x))
        assert torch.equal(narrow, wide), (cols, batch)


@needs_kernel
def test_decode_attention_writes_each_cache_and_attends_like_sdpa() -> None:
    q_heads, kv_heads, head_dim, capacity = 6, 2, 64, 96
    lengths = [0, 5, 95]  # positions held before the step: a first token, a few, a full cache
    caches = [torch.randn(2, 1, kv_heads, capacity, head_dim) for _ in lengths]
    before = [c.clone() for c in caches]
    heads = torch.randn(len(lengths), 1, q_heads + 2 * kv_heads, head_dim)
    slots = [
        (c[0].data_ptr(), c[1].data_ptr(), length, capacity)
        for c, length in zip(caches, lengths, strict=True)
    ]
    got = native.decode_attention(heads, slots, q_heads, kv_heads, head_dim**-0.5)
    for i, (cache, old, length) in enumerate(zip(caches, before, lengths, strict=True)):
        new_k = heads[i, 0, q_heads : q_heads + kv_heads]
        new_v = heads[i, 0, q_heads + kv_heads :]
        assert torch.equal(cache[0, 0, :, length], new_k)
        assert torch.equal(cache[1, 0, :, length], new_v)
        assert torch.equal(cache[:, :, :, :length], old[:, :, :, :length])  # the rest kept
        assert torch.equal(cache[:, :, :, length + 1 :], old[:, :, :, length + 1 :])
        q = heads[i : i + 1, :, :q_heads].transpose(1, 2)  # [1, q_heads, 1, head_dim]
        k, v = cache[0, :, :, : length + 1], cache[1, :, :, : length + 1]
        want = torch.nn.functional.scaled_dot_product_attention(
            q.double(), k.double(), v.double(), enable_gqa=True
        )
        torch.testing.assert_close(
            got[i].view(q_heads, head_dim), want[0, :, 0].float(), rtol=1e-5, atol=1e-6
        )
    # each session alone gives the same bits as in the batch
    for i in range(len(lengths)):
        caches[i].copy_(before[i])
        alone = native.decode_attention(
            heads[i : i + 1], slots[i : i + 1], q_heads, kv_heads, head_dim**-0.5
        )
        assert torch.equal(alone[0], got[i])


@needs_kernel
def test_decode_attention_refuses_a_position_outside_its_cache() -> None:
    cache = torch.zeros(2, 1, 1, 4, 64)
    heads = torch.randn(1, 1, 3, 64)
    slot = (cache[0].data_ptr(), cache[1].data_ptr(), 4, 4)  # position 4 of a 4-position cache
    with pytest.raises(ValueError, match="outside a cache"):
        native.decode_attention(heads, [slot], 1, 1, 0.125)
    assert not cache.any()


@needs_kernel
def test_the_runtime_config_switches_the_kernels_a_model_is_built_with() -> None:
    from swarm.config import load_config
    from swarm.runtime.execution.model import ModelContext

    before = native.switches()
    config = load_config(environ={"SWARM_RUNTIME_NATIVE_KERNELS": "0"})
    assert config.runtime.native_kernels is False
    try:
        ModelContext.open(config.runtime, progress=False)
        assert not native.available() and native.kernel_name() == "torch"
        ModelContext.open(load_config(environ={}).runtime, progress=False)
        assert native.available()
    finally:
        native.configure(before)


@needs_kernel
def test_switching_the_avx512_rows_off_keeps_the_bits() -> None:
    matrix = NativeQ4Matrix(_blocks("Q4_K", rows=64, cols=512, seed=2))
    x = torch.randn(3, 512)
    wide = matrix.matmul(x)
    with native.switched(native.KernelSwitches(avx512=False)):
        assert "AVX-512" not in native.kernel_name()
        narrow = matrix.matmul(x)
    assert torch.equal(wide, narrow)
