"""swarm's compiled CPU kernels (swarm/runtime/kernels/products.c), loaded with ctypes.

They multiply float activations by 4-bit weights in groups of 32 (Q4_0, Q4_1, Q4_K) or by
per-row int8 weights (Q8_0, Q5_K, Q6_K after requantization, and --dtype int8) with AVX2
integer multiply-adds. Each activation enters as two int8 parts per group of 32 (~15 bits
kept, where torch's kernels take bfloat16's 8), at nearly the cost of one: a decode step is
bound by reading the weights. They are built at install time where a C compiler is present and
used only on CPUs with AVX2, which they are compiled for. `available()` says whether this node
runs them; where it does not, the runtime falls back to torch's kernels.
SWARM_NATIVE_KERNEL=0 turns them off, so that a benchmark can measure both on one machine.

Nodes of one swarm should agree on this: the two paths round differently, so greedy text
through a mixed swarm can differ from one process on near ties."""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from swarm.errors import ModelError

GROUP = 32  # activations share one int8 scale per this many columns; cols must be a multiple


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("SWARM_NATIVE_KERNEL", "1") == "0":
        return None
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return None
    try:
        from swarm.runtime import _kernels  # type: ignore[attr-defined]
    except ImportError:  # not built here (no compiler at install time, or another CPU)
        return None
    library = ctypes.CDLL(_kernels.__file__)
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    four_bit = library.swarm_q4_matmul
    four_bit.argtypes = [pointer] * 5 + [size, size, size, ctypes.c_int]
    four_bit.restype = ctypes.c_int
    eight_bit = library.swarm_i8_matmul
    eight_bit.argtypes = [pointer] * 4 + [size, size, size, ctypes.c_int]
    eight_bit.restype = ctypes.c_int
    return library


def available() -> bool:
    return _library() is not None


def kernel_name() -> str:
    """What runs this node's 4-bit and int8 products, for status and benchmarks."""
    return "swarm (AVX2)" if available() else "torch"


def _product(
    name: str, weights: list[torch.Tensor], rows: int, cols: int, x: torch.Tensor
) -> torch.Tensor:
    library = _library()
    if library is None:
        raise ModelError("swarm's CPU kernels are not available on this node")
    flat = x.reshape(-1, cols).to(torch.float32).contiguous()
    out = torch.empty(flat.shape[0], rows, dtype=torch.float32)
    pointers = [w.data_ptr() for w in weights]
    threads = torch.get_num_threads()
    status = getattr(library, name)(
        *pointers, flat.data_ptr(), out.data_ptr(), rows, cols, flat.shape[0], threads
    )
    if status != 0:
        raise MemoryError("swarm's CPU kernel could not allocate its activation buffer")
    return out


def q4_matmul(
    codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    """x [..., cols] @ w.T -> [rows(x), rows] float32, w from 4-bit codes two per byte
    ([rows, cols / 2]) and a float16 scale and offset per group of 32 ([rows, cols / 32])."""
    rows, cols = int(codes.shape[0]), int(codes.shape[1]) * 2
    return _product("swarm_q4_matmul", [codes, scale, offset], rows, cols, x)


def i8_matmul(values: torch.Tensor, scale: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x [..., cols] @ (values * scale[:, None]).T -> [rows(x), rows] float32; values int8
    [rows, cols], scale float32 [rows]."""
    rows, cols = int(values.shape[0]), int(values.shape[1])
    return _product("swarm_i8_matmul", [values, scale], rows, cols, x)
