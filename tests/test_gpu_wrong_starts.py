"""Wrong starts of a node with a GPU, each a real `swarm node` process on this machine,
which has no CUDA: one `swarm: error:` line and exit status 2, before a layer is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.commands import one_line_error, swarm_command
from swarm.exits import WRONG_START

_NODE = ("node", "--preset", "local", "--port", "0")


def test_cuda_where_torch_has_none_is_one_line(tmp_path: Path) -> None:
    node = swarm_command(*_NODE, "--state-dir", str(tmp_path), "--device", "cuda")
    one_line_error(node, WRONG_START, "runtime.device is cuda", "no CUDA", "--device cpu")


def test_a_cap_too_small_for_one_layer_with_no_cpu_remainder_is_one_line(
    tmp_path: Path,
) -> None:
    """On cpu a cap splits the span as on a GPU (the stand-in): --gpu-only with room for
    no layer stops the start, naming the sizes and the ways out."""
    node = swarm_command(*_NODE, "--state-dir", str(tmp_path), "--gpu-memory", "1MiB", "--gpu-only")
    one_line_error(
        node, WRONG_START, "--gpu-only: 1 MiB", "holds not one layer", "give more --gpu-memory"
    )


@pytest.mark.parametrize("size", ["lots", "1e999", "12 parsecs"])
def test_a_gpu_memory_that_is_no_size_is_one_line(size: str, tmp_path: Path) -> None:
    node = swarm_command(*_NODE, "--state-dir", str(tmp_path), "--gpu-memory", size)
    one_line_error(node, WRONG_START, "runtime.gpu_memory_bytes must be")
