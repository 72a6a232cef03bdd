"""The GPU glue's CPU stand-in (swarm/runtime/gpu/device.py): what each call of the
`Accelerator` Protocol means where there is no GPU. The CUDA side runs in bench/gpu/check.sh."""

from __future__ import annotations

import torch

from swarm.runtime.gpu.device import GpuMonitor, HostAccelerator, accelerator
from swarm.types import Health


def test_a_cpu_device_gets_the_host_stand_in() -> None:
    assert isinstance(accelerator(torch.device("cpu")), HostAccelerator)


def test_the_host_memory_is_consistent() -> None:
    memory = HostAccelerator().memory()
    assert 0 < memory.free_bytes <= memory.total_bytes
    assert memory.held_bytes == memory.total_bytes - memory.free_bytes


def test_a_replayable_step_reruns_on_inputs_updated_in_place() -> None:
    host = HostAccelerator()
    x = torch.ones(3)
    with host.side_stream():
        replay = host.replayable(lambda: x * 2)
    x.fill_(5.0)
    host.synchronize()
    assert replay().tolist() == [10.0, 10.0, 10.0]


def test_no_gpu_means_no_readings() -> None:
    assert HostAccelerator().readings() == Health()
    assert GpuMonitor(index=0).read() == Health()  # this machine has no NVIDIA driver
