"""A slow machine made by the kernel: a cgroup v1 CPU quota around a node process.

A node under a quota of a third of a core computes three times slower, measures that on its
own steps, and announces it like any busy machine would; nothing in the node knows it is a
test. Needs root and the cgroup v1 cpu controller (/sys/fs/cgroup/cpu); `unavailable()` says
why not where they are missing, for a skip with a reason."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
# The CFS period. A step of a tiny model lasts a few ms, and a long period (the default 100 ms)
# lets a whole step run inside one unthrottled burst; 5 ms still allows a fifth of a core at
# the kernel's smallest quota (1 ms).
PERIOD_US = 5_000
MIN_CORES = 1_000 / PERIOD_US  # the kernel's smallest quota is 1 ms


def unavailable() -> str | None:
    """Why a CPU quota cannot be set here, or None when it can."""
    if not (CPU_ROOT / "cpu.cfs_quota_us").is_file():
        return f"no cgroup v1 cpu controller at {CPU_ROOT}"
    probe = CPU_ROOT / f"swarm-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as e:
        return f"cannot make a cgroup under {CPU_ROOT}: {e.strerror}"
    return None


class CpuQuota:
    """One cgroup; `limit(cores)` caps the CPU time of every process in it."""

    def __init__(self, name: str) -> None:
        self.path = CPU_ROOT / f"swarm-{os.getpid()}-{name}"
        self.path.mkdir(exist_ok=True)
        (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))

    def add(self, pid: int) -> None:
        """Move a process, all its threads, into the group (its children follow it)."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def limit(self, cores: float | None) -> None:
        """At most `cores` CPUs' worth of time per period (at least MIN_CORES); None lifts
        the cap."""
        if cores is not None and cores < MIN_CORES:
            raise ValueError(f"{cores} cores is under the {MIN_CORES} this period allows")
        quota = -1 if cores is None else round(cores * PERIOD_US)
        (self.path / "cpu.cfs_quota_us").write_text(str(quota))

    def remove(self) -> None:
        """Hand the group's processes back to the root group and delete it."""
        with contextlib.suppress(OSError):
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (CPU_ROOT / "cgroup.procs").write_text(pid)
            self.path.rmdir()
