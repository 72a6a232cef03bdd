"""Matrices that stay in GGUF's quantized blocks, and the products that run on them.

A decoder layer, the embedding and the head arrive from the store as `PackedTensor`s (the
checkpoint's own blocks, row by row). A family adapter turns each matrix it needs into a
`Matrix` through `Matrices`, never looking at the format:

* CPU, Q4_1: swarm's own 4-bit kernel (`swarm.runtime.weights.native`, float16 group scales
  and offsets, 1.00x the file's bytes) where it was built.
* CPU, every other type (Q4_0, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ*, TQ*):
  swarm's block kernels (`swarm.runtime.weights.blocks`), straight from the blocks as stored
  (1.00x). Q4_K ran on the 4-bit groups (1.11x) until its block rows caught up with them on a
  7B model's 3584-column gate and up, Q4_0 (1.11x) until its blocks ran on the byte rows
  (docs/quantization.md).
* CPU without swarm's kernels: the 4-bit types on torch's int4 group-wise product
  (`_weight_int4pack_mm_for_cpu`), each group's scale and offset becoming its bfloat16 scale
  and zero (codes exact), and every other type as one int8 value per weight with a scale per row
  (`swarm.runtime.weights.quant`), requantized from the exact dequantization a few rows at a
  time (0.94-4.6x the file's bytes, see docs/quantization.md), as are 4-bit rows not a
  multiple of 16.
* CUDA with Triton: the blocks stay in device memory as stored and the Triton kernels of
  `swarm.runtime.gpu` multiply them (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K, IQ4_NL,
  IQ4_XS, MXFP4); any other type is dequantized to float16 once, at load
  (`swarm.runtime.weights.on_gpu`).
* Other devices (CUDA without Triton too): the blocks stay on the device as they are and each
  product dequantizes its matrix first with the one dequantizer
  (`swarm.runtime.weights.dequant`; simple and exact, not fast).

Activations enter torch's CPU kernels as bfloat16 (their float32 paths are ~5-20x slower, see
README) and swarm's as int16 per group of 32 (~16 bits); results leave in the caller's
dtype. No float copy of a layer is ever made: building a
kernel form decodes one matrix (or a slice of rows) at a time.

The head decides the next token, so its kernel's rounding matters most there: `HeadShortlist`
re-scores the few highest logits in float32 from the head's own blocks, so the top candidates
(and the greedy choice) are those of the dequantized matrix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from swarm.errors import ModelError
from swarm.runtime.weights import blocks, dequant, ggml, heap, native, on_gpu
from swarm.runtime.weights.blocks import NativeBlockMatrix
from swarm.runtime.weights.quant import KERNEL_DTYPE, Int8Weight, Matrix, Weight, linear, rows_alone

_GROUP_TYPES = {"Q4_1"}  # swarm's 4-bit groups kernel
_INT4_TYPES = {"Q4_0", "Q4_1", "Q4_K"}  # torch's int4 product, without swarm's kernels
_INT4_GROUP = 32
_ROWS_PER_SLICE = 256  # rows decoded at once while requantizing to int8


@dataclass(frozen=True)
class PackedTensor:
    """A [rows, cols] matrix as GGUF blocks: uint8 [rows, row_bytes], rows in model order."""

    qtype: str
    data: torch.Tensor
    cols: int

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.data.shape[0]), self.cols)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The whole matrix in float (`swarm.runtime.weights.dequant`: bit for bit the `gguf`
        package's dequantizer, what transformers loads from the same file), a slice of rows at
        a time into `dtype`."""
        return self.rows_of(self.data, dtype)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Selected rows (an embedding lookup) in float: [len(ids), cols]."""
        return self.rows_of(self.data[ids.to(self.data.device)], dtype)

    def rows_of(self, data: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return dequant.dequantize(self.qtype, data, self.cols, dtype)


class Int4Matrix:
    """4-bit codes with a bfloat16 scale and zero per group of 32 columns (CPU)."""

    def __init__(self, packed: PackedTensor) -> None:
        decoded = ggml.decode(packed.qtype, packed.data, packed.cols)
        self.rows, self.cols = packed.shape
        # the kernel computes (code - 8) * scale + zero
        self.weight = torch._convert_weight_to_int4pack_for_cpu(decoded.codes.to(torch.int32), 1)
        zeros = decoded.offset + 8 * decoded.scale
        # scales_and_zeros: [groups, rows, 2]
        self.scales_and_zeros = (
            torch.stack([decoded.scale, zeros], dim=-1)
            .transpose(0, 1)
            .contiguous()
            .to(KERNEL_DTYPE)
        )

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + self.scales_and_zeros.nbytes

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.cols).to(KERNEL_DTYPE)
        out = torch._weight_int4pack_mm_for_cpu(
            flat, self.weight, _INT4_GROUP, self.scales_and_zeros
        )
        return out.to(x.dtype).view(*x.shape[:-1], self.rows)


class NativeQ4Matrix:
    """4-bit codes two per byte with a float16 scale and offset per group of 32 columns, run by
    swarm's own kernel (`swarm.runtime.weights.native`)."""

    def __init__(self, packed: PackedTensor) -> None:
        decoded = ggml.decode(packed.qtype, packed.data, packed.cols)
        self.rows, self.cols = packed.shape
        groups = decoded.codes.to(torch.uint8).view(self.rows, self.cols // _INT4_GROUP, 2, 16)
        # a group's 16 bytes: elements 0..15 in the low nibbles, 16..31 in the high ones
        codes = (groups[:, :, 0] | (groups[:, :, 1] << 4)).reshape(self.rows, -1)
        self.codes = heap.on_huge_pages(codes)  # a decode step streams it from memory
        self.scale = decoded.scale.to(torch.float16).contiguous()
        self.offset = decoded.offset.to(torch.float16).contiguous()

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scale.nbytes + self.offset.nbytes

    rows_alone = True  # each activation row is multiplied alone

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        out = native.q4_matmul(self.codes, self.scale, self.offset, x)
        return out if x.dtype == torch.float32 else out.to(x.dtype)


class HeadShortlist:
    """Exact logits for each step's highest candidates.

    The head's kernel (int8 requantized from the blocks, or int4 with bfloat16 scales, on
    bfloat16 activations) ranks the vocabulary; the `size` best of each row are then computed
    again in float32 from the GGUF blocks themselves (a few rows dequantized per step: ~0.5 ms
    against the head's ~9 ms on the embedded model). The top of the distribution, and so
    greedy text, then follows the float32 product of the same blocks; the rest of the
    vocabulary keeps the kernel's values."""

    def __init__(self, blocks: PackedTensor, bias: torch.Tensor | None, size: int = 8) -> None:
        self.blocks = blocks
        self.bias = bias
        self.size = size

    def rescore(self, hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """hidden [n, cols] (what entered the head), logits [n, rows]: each row's shortlist
        replaced by its float32 value, in place. A row's result does not depend on the other
        rows of the batch (its own shortlist only, summed row by row)."""
        top = logits.topk(min(self.size, logits.shape[-1]), dim=-1).indices  # [n, size]
        ids, where = torch.unique(top, return_inverse=True)
        rows = self.blocks.rows(ids, torch.float32)[where]  # [n, size, cols]
        exact = (rows * hidden.float().unsqueeze(1)).sum(-1)
        if self.bias is not None:
            exact = exact + self.bias[top].float()
        logits.scatter_(-1, top, exact.to(logits.dtype))
        return logits


def int8_from_packed(packed: PackedTensor) -> Int8Weight:
    """Per-row int8 from the blocks, a slice of rows at a time (never the whole matrix)."""
    values, scales = [], []
    for start in range(0, packed.shape[0], _ROWS_PER_SLICE):
        rows = packed.rows_of(packed.data[start : start + _ROWS_PER_SLICE], torch.float32)
        part = Int8Weight.quantize(rows)
        values.append(part.values)
        scales.append(part.scales)
    return Int8Weight(torch.cat(values), torch.cat(scales))


class DequantMatrix:
    """Blocks kept on the device; each product dequantizes the matrix it needs (non-CPU)."""

    def __init__(self, packed: PackedTensor) -> None:
        self.packed = packed

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        # the dequantizer every other path uses, so that CPU tests cover this one too
        return F.linear(x, self.packed.dequantize(x.dtype))


class StackedMatrix:
    """Matrices of different types whose outputs are concatenated (e.g. q and k in Q4_K, v in
    Q6_K, run as one fused projection)."""

    def __init__(self, parts: Sequence[Matrix]) -> None:
        self.parts = list(parts)

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(int(p.shape[0]) for p in self.parts), int(self.parts[0].shape[1]))

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def rows_alone(self) -> bool:
        return all(rows_alone(p) for p in self.parts)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p.matmul(x) for p in self.parts], dim=-1)


Source = torch.Tensor | PackedTensor  # what the store hands a layer for one matrix


@dataclass(frozen=True)
class Matrices:
    """Turns a layer's stored matrices into the form its products run on.

    `int8`: float matrices become per-row int8 (the --dtype int8 mode). Packed matrices always
    run packed on the kernels above."""

    device: torch.device
    int8: bool = False

    def fused(self, sources: Sequence[Source]) -> Weight:
        """Matrices stacked along their output rows, as one."""
        if all(isinstance(s, torch.Tensor) for s in sources):
            tensors = [s for s in sources if isinstance(s, torch.Tensor)]
            joined = tensors[0] if len(tensors) == 1 else torch.cat(tensors)
            return Int8Weight.quantize(joined) if self.int8 else joined
        runs: list[list[Source]] = []
        for s in sources:  # neighbours of one type share one kernel matrix
            if runs and _same_kind(runs[-1][-1], s):
                runs[-1].append(s)
            else:
                runs.append([s])
        matrices = [self._one(_concat(run)) for run in runs]
        return matrices[0] if len(matrices) == 1 else StackedMatrix(matrices)

    def _one(self, source: Source) -> Matrix:
        if isinstance(source, torch.Tensor):
            return Int8Weight.quantize(source) if self.int8 else _FloatMatrix(source)
        if on_gpu.runs_triton(self.device):
            return on_gpu.gpu_matrix(source.qtype, source.data, source.cols)
        if self.device.type != "cpu":
            return DequantMatrix(source)
        heap.keep_big_buffers_mapped()
        if source.qtype in _GROUP_TYPES and native.available():
            matrix: Matrix = NativeQ4Matrix(source)
        elif blocks.runs(source.qtype):
            matrix = NativeBlockMatrix(source.qtype, source.data, source.cols)
        elif source.qtype in _INT4_TYPES and source.shape[0] % 16 == 0:
            matrix = Int4Matrix(source)
        else:
            matrix = int8_from_packed(source)
        return matrix  # the loader trims the heap once a layer (`heap.trim`)


class _FloatMatrix:
    """A float matrix among packed ones (a StackedMatrix part)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    @property
    def nbytes(self) -> int:
        return int(self.weight.nbytes)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


def _same_kind(a: Source, b: Source) -> bool:
    if isinstance(a, PackedTensor) and isinstance(b, PackedTensor):
        return a.qtype == b.qtype
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)


def _concat(run: Sequence[Source]) -> Source:
    if len(run) == 1:
        return run[0]
    if isinstance(run[0], PackedTensor):
        packed = [s for s in run if isinstance(s, PackedTensor)]
        joined = heap.on_huge_pages(torch.cat([p.data for p in packed]))
        return PackedTensor(run[0].qtype, joined, run[0].cols)
    return torch.cat([s for s in run if isinstance(s, torch.Tensor)])


def to_device(source: Source, device: torch.device, dtype: torch.dtype, packed: bool) -> Source:
    """A stored tensor as the runtime holds it: float tensors in the runtime dtype; packed
    blocks moved as they are, or dequantized when the runtime asked for floats."""
    if isinstance(source, torch.Tensor):
        return source.to(device=device, dtype=dtype)
    if not packed:
        return source.dequantize(dtype).to(device)
    return PackedTensor(source.qtype, source.data.to(device), source.cols)


def source_bytes(source: Source) -> int:
    return int(source.nbytes)


class MatrixLinear(torch.nn.Module):
    """Stands in for an nn.Linear whose weight is a packed matrix (the generic adapter)."""

    def __init__(self, matrix: Weight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.matrix = matrix
        self.bias_value = bias  # a plain attribute: the module's state_dict stays empty

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.matrix, self.bias_value)


def install_packed(
    module: torch.nn.Module, weights: dict[str, Source], matrices: Matrices
) -> dict[str, torch.Tensor]:
    """Replace each nn.Linear under `module` whose weight is packed with a MatrixLinear; the
    float tensors left (norms, other biases) are returned for the module to load."""
    rest = {k: v for k, v in weights.items() if isinstance(v, torch.Tensor)}
    for name, source in weights.items():
        if isinstance(source, torch.Tensor):
            continue
        owner, _, leaf = name.rpartition(".")
        parent_name, _, child = owner.rpartition(".")
        parent = module.get_submodule(parent_name)
        if leaf != "weight" or not isinstance(getattr(parent, child), torch.nn.Linear):
            raise ModelError(f"packed parameter {name} is not the weight of a linear layer")
        setattr(
            parent, child, MatrixLinear(matrices.fused([source]), rest.pop(f"{owner}.bias", None))
        )
    return rest
