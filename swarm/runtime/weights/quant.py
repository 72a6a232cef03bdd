"""Weight-only int8: one signed byte per weight and one scale per output channel.

A decode step reads every weight once, so on a CPU it is bound by memory bandwidth: one byte
per weight instead of four moves a quarter of the bytes. On a CPU with AVX2 the product is
swarm's own kernel (`swarm.runtime.weights.native`: each activation rounded to int16 per group
of 32, ~16 bits kept, integer multiply-adds). Elsewhere it runs with bfloat16 inputs, int8 weights
and bfloat16 scales, accumulating in float32 (torch's `_weight_int8pack_mm` on CPU, which
gpt-fast uses too; on CUDA the weights are widened to bfloat16 inside the product). Its result
is handed back in the caller's dtype, so the residual stream, norms and attention keep their
own precision."""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F

from swarm.runtime.weights import native

KERNEL_DTYPE = torch.bfloat16  # activations and scales inside the int8 product
_QMAX = 127  # symmetric: [-127, 127], so the scale maps absmax exactly


class Int8Weight:
    """A [out, in] matrix as int8 values times a per-row (output channel) scale."""

    def __init__(self, values: torch.Tensor, scales: torch.Tensor) -> None:
        self.values = values  # int8 [out, in], contiguous
        self.scales = scales  # KERNEL_DTYPE [out]
        # swarm's own kernel, where built, takes float32 scales (the same values)
        self._native_scales = scales.to(torch.float32) if _native_fits(values) else None

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Int8Weight:
        """Round each row to the nearest multiple of its absmax / 127 (computed in float32)."""
        w = weight.detach().to(torch.float32)
        absmax = w.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
        # the scale the kernel will multiply by, so rounding targets the grid actually used
        scales = (absmax / _QMAX).to(KERNEL_DTYPE)
        values = torch.round(w / scales.to(torch.float32).unsqueeze(1)).clamp_(-_QMAX, _QMAX)
        return cls(values.to(torch.int8).contiguous(), scales)

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def rows_alone(self) -> bool:
        """Whether each activation row's product is computed alone, the same bits whatever
        the number of rows (swarm's kernel; torch's int8 product is not known to)."""
        return self._native_scales is not None

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.scales.nbytes

    @property
    def kernel_scales(self) -> torch.Tensor | None:
        """The float32 scales swarm's kernel multiplies by, where it runs this matrix."""
        return self._native_scales

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.values.to(torch.float32) * self.scales.to(torch.float32).unsqueeze(1)).to(
            dtype
        )

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> x @ W.T [..., out], in x's dtype."""
        if self._native_scales is not None:
            out = native.i8_matmul(self.values, self._native_scales, x)
            return out if x.dtype == torch.float32 else out.to(x.dtype)
        rows = x.reshape(-1, x.shape[-1]).to(KERNEL_DTYPE)
        if _use_cpu_kernel(rows):
            out = torch._weight_int8pack_mm(rows, self.values, self.scales)
        else:  # the CUDA kernel of _weight_int8pack_mm is float32-only and naive
            out = F.linear(rows, self.values.to(KERNEL_DTYPE)) * self.scales
        return out.to(x.dtype).view(*x.shape[:-1], self.values.shape[0])


def _native_fits(values: torch.Tensor) -> bool:
    return (
        values.device.type == "cpu" and values.shape[-1] % native.GROUP == 0 and native.available()
    )


def _use_cpu_kernel(x: torch.Tensor) -> bool:
    return x.device.type == "cpu"


class Matrix(Protocol):
    """What a layer needs of a weight matrix held in some compact form: x @ W.T."""

    @property
    def shape(self) -> torch.Size | tuple[int, int]: ...

    @property
    def nbytes(self) -> int: ...

    def matmul(self, x: torch.Tensor) -> torch.Tensor: ...


Weight = torch.Tensor | Matrix


def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for float or compact weights; float weights take F.linear itself (bit-exact)."""
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    out = weight.matmul(x)
    return out if bias is None else out + bias


def rows_alone(weight: Weight) -> bool:
    """Whether x @ W.T gives each row of x the bits it gets alone, for any number of rows:
    true of swarm's kernels (each row its own dot products), not of torch's float products
    (a matrix-matrix product sums in another order than a matrix-vector one)."""
    return bool(getattr(weight, "rows_alone", False))


def weight_bytes(shape: tuple[int, ...], element_size: int, int8: bool) -> int:
    """Bytes of one parameter in memory: int8 matrices carry a bfloat16 scale per row; other
    parameters (norms, biases) keep the float element size."""
    n = 1
    for d in shape:
        n *= d
    if int8 and len(shape) == 2:
        return n + shape[0] * torch.empty((), dtype=KERNEL_DTYPE).element_size()
    return n * element_size


class Int8Linear(torch.nn.Module):
    """Stands in for an nn.Linear inside a Hugging Face layer (the generic adapter)."""

    def __init__(self, linear_module: torch.nn.Linear) -> None:
        super().__init__()
        self.weight_int8 = Int8Weight.quantize(linear_module.weight)
        self.bias = linear_module.bias
        self.in_features = linear_module.in_features
        self.out_features = linear_module.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight_int8, self.bias)


def quantize_linears(module: torch.nn.Module) -> Any:
    """Replace every nn.Linear under `module` with an Int8Linear; returns `module`."""
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, Int8Linear(child))
        else:
            quantize_linears(child)
    return module
