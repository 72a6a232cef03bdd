"""The Triton kernels compiled for an H100 (sm_90) on a machine without a GPU: what the
interpreter tests cannot see (the compiler's types and lowering). bench.gpu_check
--compile-only compiles every type and both activation dtypes; this compiles the kernels of
the types that matter most, to keep the suite fast."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import swarm.runtime.gpu as gpu_package
from harness.gpu_compile import TILES, compile_kernel

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (the dev extra brings it)", allow_module_level=True)

_KERNEL_MODULES = ("swarm.runtime.gpu.blocks", "swarm.runtime.gpu.products")


def _drop_kernel_modules() -> None:
    for name in _KERNEL_MODULES:
        sys.modules.pop(name, None)
        if hasattr(gpu_package, name.rpartition(".")[2]):
            delattr(gpu_package, name.rpartition(".")[2])


@pytest.fixture(scope="module", autouse=True)
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The kernel modules imported as compiled kernels, Triton's cache in a temporary folder,
    its fused multiply-adds on as Triton 3.9 defaults them (said, so it does not warn)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(tl.zeros, InterpretedFunction):
        pytest.skip("Triton was imported under its interpreter in this process")
    cache: Path = tmp_path_factory.mktemp("triton-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("TRITON_INTERPRET", raising=False)
        patch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
        patch.setenv("TRITON_CACHE_DIR", str(cache))
        _drop_kernel_modules()
        importlib.import_module("swarm.runtime.gpu.products")
        try:
            yield
        finally:
            _drop_kernel_modules()


@pytest.mark.parametrize("kernel", sorted(TILES))
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_the_kernels_compile_for_an_h100(qtype: str, kernel: str) -> None:
    out = compile_kernel(qtype, kernel, "fp32")
    assert out.cubin_bytes > 0
