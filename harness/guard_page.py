"""Every block kernel on a matrix whose last byte sits just before a page the process cannot
read: a kernel that reads past a matrix's last block faults there (as it did on a real
Q3_K_M file, whose fused q and k matrices ended on a page boundary) instead of silently
reading a neighbour's bytes.

    python -m harness.guard_page   (one line per type; a fault kills the process)

Run in a subprocess by tests/test_block_kernel.py, so that a fault fails one test."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import torch

from harness.block_bytes import random_blocks
from swarm.runtime.weights import ggml, native
from swarm.runtime.weights.blocks import NativeBlockMatrix

_LIBC = ctypes.CDLL(None)


class GuardedBytes:
    """`size` writable bytes ending where an unreadable page begins."""

    def __init__(self, size: int) -> None:
        page = mmap.PAGESIZE
        span = -(-size // page) * page + page
        self._map = mmap.mmap(-1, span, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        guard = base + span - page
        if _LIBC.mprotect(ctypes.c_void_p(guard), page, 0) != 0:  # PROT_NONE
            raise OSError("mprotect refused to protect the guard page")
        self.array = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(guard - size))


def _shapes(qtype: str) -> list[tuple[int, int]]:
    """(rows, cols): rows not a multiple of a task's 64; cols of two blocks of 256, or of 19
    groups of 32 (a lone group after the last quad), and a long row run side by side"""
    if ggml.BLOCKS[qtype].elements == 256:
        return [(3, 512), (2, 8192)]
    return [(3, 32 * 19), (2, 8192)]


def check(qtype: str) -> None:
    """Products of `qtype` blocks at the end of a guarded buffer, every path: AVX2 and AVX-512
    rows, one activation row and a batch."""
    rng = np.random.default_rng(0)
    for rows, cols in _shapes(qtype):
        blocks = rows * cols // ggml.BLOCKS[qtype].elements
        raw = random_blocks(rng, blocks, qtype).reshape(rows, -1)
        guarded = GuardedBytes(raw.nbytes)
        guarded.array[:] = raw.reshape(-1)
        data = torch.from_numpy(guarded.array.reshape(raw.shape))
        matrix = NativeBlockMatrix(qtype, data, cols)
        for wide in (False, True):
            native.use_wide(wide)
            for batch in (1, 9):
                matrix.matmul(torch.randn(batch, cols))
    native.use_wide(True)


def main() -> None:
    for qtype in sorted(ggml.BLOCKS):
        print(qtype, end=" ", flush=True)
        check(qtype)
        print("ok", flush=True)


if __name__ == "__main__":
    main()
