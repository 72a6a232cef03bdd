"""The C library's heap, kept from holding on to memory a node has freed; and weights placed
on transparent huge pages.

glibc raises its mmap threshold after the first big free, so that later big buffers (decoded
codes, int32 copies, a released shard's tensors) come from the heap instead of their own
mappings; freed, they stay resident, and a node's memory then grows by ~0.5-1x the bytes it
converted or dropped. A fixed threshold keeps big buffers in their own mappings, and a trim
after big frees hands back the heap pages left free. Both do nothing where the C library is
not glibc.

A decode step streams every weight once from memory, and on 4 KiB pages a pass over a
60 MB matrix walks ~15,000 page-table entries: two threads reading Q4_K and Q6_K rows of
3584 x 18944 took 2.5-3.6 ms on 4 KiB pages and 2.2-3.0 on 2 MiB ones (15-20%). Kernels
that set transparent huge pages to `madvise` (the common default) give them only to memory
that asks, and malloc does not ask, so `on_huge_pages` places a big weight in memory that
does: a copy when it is read from the store (two copies for the ~1 s a 4.4 GB model takes to
read; the kernel's own collapse of pages already written ran at ~0.6 GB/s)."""

from __future__ import annotations

import ctypes
import mmap
from typing import Any

import torch

_M_MMAP_THRESHOLD = -3  # mallopt parameter number, from malloc.h
_MMAP_THRESHOLD = 1 << 20  # bytes: fixed, so the threshold no longer adapts upwards
_LIBC: Any = None
_HUGE = 2 << 20  # bytes of one transparent huge page on x86-64


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


def on_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of at least one huge page, copied into its own private anonymous mapping
    advised for transparent huge pages before it is written (so its pages are huge from the
    start; the mapping goes with the tensor); any other tensor, or where the system cannot
    advise it, `t` itself. Callers place a weight once, where it is first read, so that
    tensors sharing it (a tied head and embedding) still share it."""
    if t.device.type != "cpu" or t.nbytes < _HUGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return t
    # private: a shared anonymous mapping is shmem, whose huge pages have a setting of their own
    mapping = mmap.mmap(-1, t.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        mapping.close()
        return t
    # frombuffer keeps a reference to the mapping: it is unmapped with the last view
    placed = torch.frombuffer(mapping, dtype=torch.uint8).view(t.dtype).view(t.shape)
    placed.copy_(t)
    return placed
