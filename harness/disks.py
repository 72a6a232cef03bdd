"""Disks that fill up, for tests of what a node does when a write fails: a small tmpfs, and a
file that leaves a given number of bytes free on it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(folder: Path, size_mib: int) -> Iterator[Path]:
    """A tmpfs of `size_mib` MiB mounted at `folder` (made here); skips the test where
    mounting is not allowed (it needs root)."""
    folder.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill_to(disk: Path, free_bytes: int) -> Path:
    """A file on `disk` that leaves about `free_bytes` free; delete it to free the space."""
    stat = os.statvfs(disk)
    filler = disk / "filler"
    filler.write_bytes(bytes(max(0, stat.f_bavail * stat.f_frsize - free_bytes)))
    return filler
