"""What the accelerator is doing: its memory, its utilization, and the device time of each batch.

    source                          what                                          when read
    torch.cuda.memory_allocated     bytes held by live tensors (this process)     at scrape
    torch.cuda.memory_reserved      bytes the caching allocator holds             at scrape
    NVML (nvidia-ml-py, optional)   GPU utilization %, memory used/total (all     at scrape
                                    processes on the device)
    CUDA events (DeviceClock)       device time of each encode / fuse batch       recorded per batch,
                                                                                  summed at scrape

All of it exists only on CUDA: on the CPU ``DeviceTelemetry.for_device``
returns None and the server exports none of these series (absent, not zero:
a zero would claim a device that is idle). NVML comes with ``pip install
'mmserve[gpu]'``; without it, or where the driver does not answer, the
utilization series are left out and the rest stays.

``DeviceClock`` brackets a batch's work on the calling thread's stream with
two CUDA events; nothing waits for them. At scrape the finished pairs are
read (``Event.query`` does not block) and their times summed per stage, so
timing costs the hot path two event records and no synchronisation.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageDeviceTime:
    """Batches of one stage whose device time is known, and their total device time."""

    num_batches: int
    seconds: float


class DeviceClock:
    """Device time per batch and stage from CUDA events (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._totals: dict[str, StageDeviceTime] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def measure(self, stage: str) -> Iterator[None]:
        stream = torch.cuda.current_stream(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        yield
        end.record(stream)
        with self._lock:
            self._pending.append((stage, start, end))

    def totals(self) -> dict[str, StageDeviceTime]:
        """Every stage's finished batches so far (the ones still running are counted at a later read)."""
        with self._lock:
            still_running = []
            for stage, start, end in self._pending:
                if not end.query():
                    still_running.append((stage, start, end))
                    continue
                before = self._totals.get(stage, StageDeviceTime(0, 0.0))
                self._totals[stage] = StageDeviceTime(before.num_batches + 1,
                                                      before.seconds + start.elapsed_time(end) / 1000.0)
            self._pending = still_running
            return dict(self._totals)


@dataclass(frozen=True)
class DeviceReading:
    """One read of the device; the NVML fields are None without NVML."""

    allocated_bytes: int
    reserved_bytes: int
    utilization_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None


def _nvml_handle(device: torch.device) -> tuple[Any, Any] | None:
    """(pynvml, handle) for ``device``, or None without nvidia-ml-py or a driver that answers."""
    try:
        import pynvml
    except ImportError:
        logger.info("nvidia-ml-py is not installed (pip install 'mmserve[gpu]'): no device utilization metrics")
        return None
    try:
        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as e:
        logger.warning("NVML is not available (%s): no device utilization metrics", e)
        return None


class DeviceTelemetry:
    """Reads of one CUDA device and its batches' device time; ``for_device`` is None on the CPU."""

    def __init__(self, device: torch.device, nvml: tuple[Any, Any] | None) -> None:
        self.device = device
        self.clock = DeviceClock(device)
        self._nvml = nvml

    @classmethod
    def for_device(cls, device: torch.device) -> DeviceTelemetry | None:
        if device.type != "cuda":
            return None
        return cls(device, _nvml_handle(device))

    @property
    def has_nvml(self) -> bool:
        return self._nvml is not None

    def read(self) -> DeviceReading:
        allocated = torch.cuda.memory_allocated(self.device)
        reserved = torch.cuda.memory_reserved(self.device)
        if self._nvml is None:
            return DeviceReading(allocated, reserved)
        pynvml, handle = self._nvml
        try:
            utilization = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError as e:
            logger.warning("NVML read failed (%s)", e)
            return DeviceReading(allocated, reserved)
        return DeviceReading(allocated, reserved, float(utilization.gpu), int(memory.used), int(memory.total))
