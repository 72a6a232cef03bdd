"""Weights placed on transparent huge pages (swarm.runtime.weights.heap.on_huge_pages): the
same values in a mapping the kernel may back with 2 MiB pages, freed with the tensor; small
tensors left as they are."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swarm.runtime.weights import heap

_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _mapping_of(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping holding `address`."""
    fields: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def test_a_big_tensor_is_copied_into_memory_advised_for_huge_pages() -> None:
    original = torch.arange(3 << 20, dtype=torch.int32).view(1024, -1)
    placed = heap.on_huge_pages(original)
    assert torch.equal(placed, original) and placed.dtype == original.dtype
    assert placed.data_ptr() != original.data_ptr()
    if _THP.is_file() and "[never]" not in _THP.read_text():
        assert _mapping_of(placed.data_ptr()).get("THPeligible") == "1"


def test_a_small_tensor_stays_where_it_is() -> None:
    small = torch.ones(1000)
    assert heap.on_huge_pages(small) is small


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="no /proc/self/smaps")
def test_the_mapping_goes_with_the_tensor() -> None:
    placed = heap.on_huge_pages(torch.zeros(4 << 20, dtype=torch.uint8))
    address = placed.data_ptr()
    assert _mapping_of(address)
    del placed
    assert not _mapping_of(address)
