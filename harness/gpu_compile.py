"""The Triton kernels compiled ahead of time for an NVIDIA GPU that need not be there: Triton
brings ptxas, so a machine without a GPU can still take each kernel down to a cubin and catch
what only the compiler sees (types, layouts, unsupported operations). Shared by
tests/test_gpu_compile.py and `python -m bench.gpu_check --compile-only`."""

from __future__ import annotations

import time
from dataclasses import dataclass

from swarm.runtime.weights import ggml

# the arguments both kernels take before their constexprs, and their Triton types
_SIGNATURE = {
    "x": "*{act}",
    "w": "*u8",
    "table": "*fp32",
    "y": "*{act}",
    "rows": "i32",
    "n": "i32",
    "k": "i32",
    "row_bytes": "i32",
    "x_stride": "i32",
    "y_stride": "i32",
}
# kernel -> (BLOCK_M, BLOCK_N, BLOCK_K) as TritonBlockMatrix launches it (its largest decode tile)
TILES = {"decode_kernel": (8, 32, 32), "prefill_kernel": (64, 64, 32)}


@dataclass(frozen=True)
class Compiled:
    qtype: str
    kernel: str
    activations: str  # "fp32" or "fp16"
    seconds: float
    cubin_bytes: int


def compile_kernel(qtype: str, kernel: str, activations: str, arch: int = 90) -> Compiled:
    """One kernel for one block type, compiled for sm_<arch> down to its cubin."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from swarm.runtime.gpu import products

    fn = getattr(products, kernel)
    kind = ggml.BLOCKS[qtype]
    block_m, block_n, block_k = TILES[kernel]
    constants = {
        "QTYPE": qtype,
        "ELEMENTS": kind.elements,
        "NBYTES": kind.nbytes,
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_K": block_k,
    }
    signature = {name: t.format(act=activations) for name, t in _SIGNATURE.items()}
    signature.update(dict.fromkeys(constants, "constexpr"))
    where = {(fn.arg_names.index(name),): value for name, value in constants.items()}
    start = time.perf_counter()
    out = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=where),
                         target=GPUTarget("cuda", arch, 32))  # fmt: skip
    return Compiled(qtype, kernel, activations, time.perf_counter() - start, len(out.asm["cubin"]))
