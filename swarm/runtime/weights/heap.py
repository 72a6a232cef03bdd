"""The C library's heap, kept from holding on to memory a node has freed.

glibc raises its mmap threshold after the first big free, so that later big buffers (decoded
codes, int32 copies, a released shard's tensors) come from the heap instead of their own
mappings; freed, they stay resident, and a node's memory then grows by ~0.5-1x the bytes it
converted or dropped. A fixed threshold keeps big buffers in their own mappings, and a trim
after big frees hands back the heap pages left free. Both do nothing where the C library is
not glibc."""

from __future__ import annotations

import ctypes
from typing import Any

_M_MMAP_THRESHOLD = -3  # mallopt parameter number, from malloc.h
_MMAP_THRESHOLD = 1 << 20  # bytes: fixed, so the threshold no longer adapts upwards
_LIBC: Any = None


def _glibc() -> Any:
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC or None


def keep_big_buffers_mapped() -> None:
    """Fix the mmap threshold (once per process; later calls do nothing)."""
    _glibc()


def trim() -> None:
    """Hand freed heap pages back to the system."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
