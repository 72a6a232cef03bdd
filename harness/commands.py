"""The `swarm` command as a user runs it, in a process of its own: its stdout, stderr and exit
status, and what a failed command must look like (one line, no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import IO

from harness.paths import MODEL_CACHE, REPO


def swarm_command(
    *args: str,
    cache: Path | None = None,
    timeout: float = 240,
    cwd: Path | None = None,
    stdout: int | IO[str] | None = subprocess.PIPE,
) -> subprocess.CompletedProcess[str]:
    """`python -m swarm *args`, from `cwd` (this checkout's swarm wherever it runs), with
    `cache` as its model cache."""
    env = {
        **os.environ,
        "SWARM_RUNTIME_CACHE_DIR": str(cache or MODEL_CACHE),
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        [sys.executable, "-m", "swarm", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )


def one_line_error(result: subprocess.CompletedProcess[str], status: int, *fragments: str) -> str:
    """Assert that `result` failed with `status` and said why in one `swarm: error:` line,
    its stderr's last, holding every fragment; that line."""
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("swarm: error: ")]
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0]), result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]
