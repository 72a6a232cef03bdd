"""The Triton kernels on packed GGUF blocks (swarm/runtime/gpu), run by Triton's interpreter on
CPU tensors against the reference dequantizer: y = x @ dequantize(W).T in float32.

Tolerances, per output element, relative to sum_k |x_k| |w_k| (the size a float sum of those
products can be off by, whatever its order): 1e-5 where activations and sums are float32 (the
kernels' decoding equals the reference's values; only the order of the sums differs) and 4e-3
for float16 activations, whose outputs are rounded to float16 and whose prefill tiles enter
`tl.dot` as float16 weights. What a GPU compiles is checked by bench/gpu/check.sh, not here."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterable, Iterator

import numpy as np
import pytest
import torch

import swarm.runtime.gpu as gpu_package
from harness.block_bytes import random_blocks
from swarm.runtime.gpu.matrix import DECODE_ROWS, KERNEL_TYPES, TritonBlockMatrix
from swarm.runtime.weights import dequant, ggml, on_gpu
from swarm.runtime.weights.on_gpu import HalfMatrix, gpu_matrix, triton_matrix
from swarm.runtime.weights.packed import Matrices, PackedTensor, StackedMatrix

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (the dev extra brings it)", allow_module_level=True)

_KERNEL_MODULES = ("swarm.runtime.gpu.blocks", "swarm.runtime.gpu.products")
_ROWS = 37  # not a multiple of any tile
_BATCHES = (1, 3, DECODE_ROWS, 19)  # the decode kernel up to DECODE_ROWS, prefill above


def _interpreter_bound(name: str) -> bool:
    # Triton's compiled extension (triton._C) stays: it cannot be loaded twice
    python_part = name == "triton" or (
        name.startswith("triton.") and not name.startswith("triton._C")
    )
    return name in _KERNEL_MODULES or python_part


def _take_modules(names: Iterable[str]) -> None:
    for name in list(names):
        sys.modules.pop(name, None)
    for name in _KERNEL_MODULES:  # `from swarm.runtime.gpu import products` reads these first
        if hasattr(gpu_package, name.rpartition(".")[2]):
            delattr(gpu_package, name.rpartition(".")[2])


def _bound() -> list[str]:
    return [name for name in sys.modules if _interpreter_bound(name)]


@pytest.fixture(scope="module", autouse=True)
def interpreted() -> Iterator[None]:
    """Triton imported under TRITON_INTERPRET=1 (it decides at import and decoration whether a
    function is interpreted, its own tl.zeros and tl.sum included), with the kernel modules;
    afterwards the kernel modules are dropped and the variable unset, so no later test gets
    interpreted kernels. Triton's Python modules stay as imported here: dropping them once a
    kernel has run makes its compiled extension report leaks at exit (a copy imported before
    stays with whoever imported it, as torch's optional Triton ops do)."""
    _take_modules(_bound())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        importlib.import_module("swarm.runtime.gpu.products")
        try:
            yield
        finally:
            _take_modules(_KERNEL_MODULES)


def _packed(qtype: str, rows: int, blocks_per_row: int, seed: int) -> PackedTensor:
    kind = ggml.BLOCKS[qtype]
    raw = random_blocks(np.random.default_rng(seed), rows * blocks_per_row, qtype)
    data = torch.from_numpy(raw).view(rows, blocks_per_row * kind.nbytes)
    return PackedTensor(qtype, data, blocks_per_row * kind.elements)


def _blocks_per_row(qtype: str) -> int:
    return 5 if ggml.BLOCKS[qtype].elements == 32 else 2  # K of several blocks and tiles


def _assert_close(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, tolerance: float) -> None:
    x32 = x.float()
    reference = x32 @ w.T
    bound = tolerance * (x32.abs() @ w.abs().T) + 1e-30
    worst = ((y.float() - reference).abs() / bound).max().item()
    assert worst <= 1.0, f"error {worst:.2f}x the tolerance"


@pytest.mark.parametrize("qtype", sorted(KERNEL_TYPES))
def test_every_kernel_gives_the_reference_product_in_float32(qtype: str) -> None:
    packed = _packed(qtype, _ROWS, _blocks_per_row(qtype), seed=len(qtype))
    matrix = triton_matrix(qtype, packed.data, packed.cols)
    w = dequant.dequantize(qtype, packed.data, packed.cols)
    gen = torch.Generator().manual_seed(3)
    for batch in _BATCHES:
        x = torch.randn(batch, packed.cols, generator=gen)
        y = matrix.matmul(x)
        assert y.shape == (batch, _ROWS) and y.dtype == torch.float32
        _assert_close(y, x, w, 1e-5)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q5_K"])
@pytest.mark.parametrize("batch", [3, 24])
def test_float16_activations_take_both_kernels(qtype: str, batch: int) -> None:
    packed = _packed(qtype, _ROWS, _blocks_per_row(qtype), seed=7)
    x = torch.randn(batch, packed.cols, generator=torch.Generator().manual_seed(5))
    y = triton_matrix(qtype, packed.data, packed.cols).matmul(x.half())
    assert y.dtype == torch.float16
    _assert_close(y, x.half(), dequant.dequantize(qtype, packed.data, packed.cols), 4e-3)


def test_leading_dimensions_and_a_strided_batch_keep_their_shape() -> None:
    packed = _packed("Q4_K", 70, 2, seed=11)  # more rows than one prefill tile
    matrix = triton_matrix("Q4_K", packed.data, packed.cols)
    x = torch.randn(2, 9, packed.cols, generator=torch.Generator().manual_seed(2))
    y = matrix.matmul(x[:, ::3])  # [2, 3, cols], not contiguous
    assert y.shape == (2, 3, 70)
    w = dequant.dequantize("Q4_K", packed.data, packed.cols)
    _assert_close(y.reshape(-1, 70), x[:, ::3].reshape(-1, packed.cols), w, 1e-5)


def test_an_empty_batch_launches_nothing() -> None:
    packed = _packed("Q8_0", 4, 1, seed=1)
    y = triton_matrix("Q8_0", packed.data, packed.cols).matmul(torch.empty(0, packed.cols))
    assert y.shape == (0, 4)


def test_a_type_without_a_kernel_is_dequantized_once_to_float16() -> None:
    packed = _packed("IQ2_XS", 5, 1, seed=4)
    matrix = gpu_matrix("IQ2_XS", packed.data, packed.cols)
    assert isinstance(matrix, HalfMatrix) and matrix.weight.dtype == torch.float16
    assert matrix.nbytes == 5 * packed.cols * 2
    x = torch.randn(3, packed.cols, generator=torch.Generator().manual_seed(0))
    _assert_close(matrix.matmul(x), x.half(), matrix.weight.float(), 4e-3)


def test_packed_matrices_on_a_cuda_device_run_on_the_kernels() -> None:
    cuda = torch.device("cuda")  # only a device: the blocks stay CPU tensors, interpreted
    sources = [_packed("Q4_K", 6, 1, seed=1), _packed("Q6_K", 5, 1, seed=2)]
    sources.append(_packed("IQ2_XS", 4, 1, seed=3))
    matrix = Matrices(cuda).fused(sources)
    assert isinstance(matrix, StackedMatrix)
    kinds = [type(part) for part in matrix.parts]
    assert kinds == [TritonBlockMatrix, TritonBlockMatrix, HalfMatrix]
    w = torch.cat([s.dequantize() for s in sources])
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(8))
    _assert_close(matrix.matmul(x), x.half(), w, 4e-3)  # the float16 part sets the bound


def test_one_line_names_what_a_cuda_device_holds_as_float16() -> None:
    tensors: dict[str, object] = {
        "blk.0.attn_q.weight": _packed("Q4_K", 4, 1, seed=0),
        "blk.0.ffn_up.weight": _packed("IQ2_XS", 4096, 1, seed=0),
        "blk.0.attn_norm.weight": torch.ones(256),
    }
    assert on_gpu.load_note(tensors, torch.device("cuda")) == (
        "dequantized to float16 at load, no GPU kernel for their types: "
        "blk.0.ffn_up.weight (IQ2_XS) (0.3 MiB as stored, 2.0 MiB as float16)"
    )
    del tensors["blk.0.ffn_up.weight"]
    assert on_gpu.load_note(tensors, torch.device("cuda")) is None


def test_a_cpu_model_neither_notes_nor_takes_the_gpu_path() -> None:
    tensors = {"blk.0.ffn_up": _packed("IQ2_XS", 2, 1, seed=0)}
    assert on_gpu.load_note(tensors, torch.device("cpu")) is None
    assert not on_gpu.runs_triton(torch.device("cpu"))
    matrix = Matrices(torch.device("cpu")).fused([_packed("Q4_K", 2, 1, seed=0)])
    assert type(matrix).__module__ != "swarm.runtime.gpu.matrix"
