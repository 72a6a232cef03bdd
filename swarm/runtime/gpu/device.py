"""The CUDA-only glue a GPU node needs, behind one Protocol (`Accelerator`): device memory,
a side stream, CUDA graphs, and nvml's readings. `CudaAccelerator` is the real one;
`HostAccelerator` stands in for it on a CPU (in tests, and on a node without a GPU), doing
what each call means there: memory is the host's, a stream is the caller's, a graph is the
step itself, and there are no GPU readings."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import psutil
import torch

from swarm.types import Health

log = logging.getLogger(__name__)

Step = Callable[[], torch.Tensor]  # work on tensors it holds, returning one of them


@dataclass(frozen=True)
class DeviceMemory:
    free_bytes: int  # what the device could still hand out
    total_bytes: int  # the device's whole memory
    held_bytes: int  # what this process's tensors hold on it


class Accelerator(Protocol):
    def memory(self) -> DeviceMemory: ...

    def synchronize(self) -> None:
        """Return once all queued work is done (timings read after this are real)."""

    def side_stream(self) -> contextlib.AbstractContextManager[None]:
        """Work queued inside runs on a stream of its own, ordered after what came before."""

    def replayable(self, step: Step) -> Step:
        """`step` as one replayable launch (a CUDA graph): the returned function reruns the
        same kernels on the same tensors, so the caller updates inputs in place."""

    def readings(self) -> Health: ...


@dataclass
class GpuMonitor:
    """Reads temperature, utilisation, memory, power and throttle reasons through pynvml;
    Health() without a GPU."""

    index: int = 0
    _handle: Any = field(default=None, init=False)
    _tried: bool = field(default=False, init=False)

    def read(self) -> Health:
        handle = self._open()
        if handle is None:
            return Health()
        import pynvml

        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            temperature = pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
            utilization = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        except pynvml.NVMLError as e:
            log.warning("GPU readings failed: %s", e)
            return Health()
        power_mw = _optional(pynvml.nvmlDeviceGetPowerUsage, handle)
        return Health(
            gpu_temperature_c=float(temperature),
            gpu_utilization=utilization / 100.0,
            gpu_memory_used_bytes=int(memory.used),
            gpu_memory_total_bytes=int(memory.total),
            gpu_power_w=None if power_mw is None else power_mw / 1000.0,
            gpu_throttle_reasons=_optional(
                pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle
            ),
        )

    def _open(self) -> Any:
        if not self._tried:
            self._tried = True
            try:
                import pynvml

                pynvml.nvmlInit()
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            except Exception as e:  # no driver, no GPU, no library: all mean "no GPU readings"
                log.debug("no NVIDIA GPU readings: %s", e)
                self._handle = None
        return self._handle


def _optional(read: Callable[[Any], int], handle: Any) -> int | None:
    """A reading some GPUs lack (power on many consumer cards under some drivers): None
    where nvml says it is not supported there, rather than no readings at all."""
    import pynvml

    try:
        return int(read(handle))
    except pynvml.NVMLError:
        return None


class CudaAccelerator:
    """One CUDA device through torch.cuda, its readings through nvml."""

    def __init__(self, device: torch.device, monitor: GpuMonitor) -> None:
        self.device = device
        self.monitor = monitor
        self._stream: torch.cuda.Stream | None = None

    def memory(self) -> DeviceMemory:
        free, total = torch.cuda.mem_get_info(self.device)
        return DeviceMemory(int(free), int(total), int(torch.cuda.memory_allocated(self.device)))

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            yield
        torch.cuda.current_stream(self.device).wait_stream(self._stream)

    def replayable(self, step: Step) -> Step:
        with self.side_stream():  # a warm-up compiles and autotunes outside the capture
            step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay

    def readings(self) -> Health:
        return self.monitor.read()


class HostAccelerator:
    """The CPU stand-in: what each call means where there is no GPU."""

    def memory(self) -> DeviceMemory:
        vm = psutil.virtual_memory()
        return DeviceMemory(int(vm.available), int(vm.total), int(vm.total - vm.available))

    def synchronize(self) -> None:
        return None  # CPU work is done when its call returns

    def side_stream(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def replayable(self, step: Step) -> Step:
        return step

    def readings(self) -> Health:
        return Health()


def accelerator(device: torch.device) -> Accelerator:
    """The glue for `device`: CUDA's where it is a CUDA device, the CPU stand-in elsewhere."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return CudaAccelerator(torch.device("cuda", index), GpuMonitor(index))
    return HostAccelerator()
