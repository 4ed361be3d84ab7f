"""The accelerator's series on ``/metrics``, read at scrape time; none at all on the CPU.

    mmserve_device_memory_bytes{kind}            allocated, reserved (this process's torch allocator);
                                                 used, total (the whole device, NVML)
    mmserve_device_utilization_ratio             share of the last sample period a kernel ran (NVML), 0..1
    mmserve_device_batch_seconds_total{stage}    device time of finished batches, per stage (CUDA events)
    mmserve_device_batches_total{stage}          batches counted in it: rate(seconds) / rate(batches) is
                                                 the device time per batch
    mmserve_device_decode_images_total{outcome}  with --decode-device cuda only: JPEGs handed to the device
                                                 decoder, ``decoded`` there or ``left_to_cpu`` (not a JPEG
                                                 it takes, or refused by nvJPEG; Pillow decoded it)

On the CPU nothing is registered, so the series are absent rather than zero;
without nvidia-ml-py (``mmserve[gpu]``) the NVML series are left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from models.device_telemetry import DeviceReading, DeviceTelemetry, StageDeviceTime
from models.jpeg_decode import DeviceJpegDecoder
from models.loading.repository import ModelBundle


class _Readings(Protocol):
    def read(self) -> DeviceReading: ...

    def stage_times(self) -> dict[str, StageDeviceTime]: ...


class _TelemetryReadings:
    def __init__(self, telemetry: DeviceTelemetry) -> None:
        self._telemetry = telemetry

    def read(self) -> DeviceReading:
        return self._telemetry.read()

    def stage_times(self) -> dict[str, StageDeviceTime]:
        return self._telemetry.clock.totals()


class DeviceMetricsCollector(Collector):
    """Exports one device's readings at scrape time (a custom collector: nothing runs between scrapes)."""

    def __init__(self, readings: _Readings) -> None:
        self._readings = readings

    def collect(self) -> Iterator[Metric]:
        reading = self._readings.read()
        memory = GaugeMetricFamily("mmserve_device_memory_bytes", "Device memory: allocated and reserved by this "
                                   "process's allocator; used and total on the whole device (NVML).",
                                   labels=["kind"])
        memory.add_metric(["allocated"], reading.allocated_bytes)
        memory.add_metric(["reserved"], reading.reserved_bytes)
        if reading.memory_used_bytes is not None and reading.memory_total_bytes is not None:
            memory.add_metric(["used"], reading.memory_used_bytes)
            memory.add_metric(["total"], reading.memory_total_bytes)
        yield memory
        if reading.utilization_percent is not None:
            yield GaugeMetricFamily("mmserve_device_utilization_ratio", "Share of the last NVML sample period in "
                                    "which a kernel ran on the device.", value=reading.utilization_percent / 100.0)
        seconds = CounterMetricFamily("mmserve_device_batch_seconds", "Device time of finished batches (CUDA "
                                      "events around each batch's work).", labels=["stage"])
        batches = CounterMetricFamily("mmserve_device_batches", "Batches whose device time is counted.",
                                      labels=["stage"])
        for stage, total in sorted(self._readings.stage_times().items()):
            seconds.add_metric([stage], total.seconds)
            batches.add_metric([stage], total.num_batches)
        yield seconds
        yield batches


def register_device_metrics(registry: CollectorRegistry, bundle: ModelBundle) -> DeviceTelemetry | None:
    """On CUDA: time the model's batches and export the device's series; on the CPU: nothing (None)."""
    telemetry = DeviceTelemetry.for_device(bundle.model.device)
    if telemetry is None:
        return None
    bundle.model.device_clock = telemetry.clock
    registry.register(DeviceMetricsCollector(_TelemetryReadings(telemetry)))
    return telemetry


class DeviceDecodeCollector(Collector):
    """The device JPEG decoder's counts at scrape time: how much of the decoding the GPU actually did."""

    def __init__(self, decoder: DeviceJpegDecoder) -> None:
        self._decoder = decoder

    def collect(self) -> Iterator[Metric]:
        images = CounterMetricFamily("mmserve_device_decode_images", "Images handed to the device JPEG decoder "
                                     "(--decode-device cuda): decoded there, or left to the CPU decoder.",
                                     labels=["outcome"])
        images.add_metric(["decoded"], self._decoder.num_device_decoded)
        images.add_metric(["left_to_cpu"], self._decoder.num_left_to_caller)
        yield images


def register_device_decode_metrics(registry: CollectorRegistry, decoder: DeviceJpegDecoder | None) -> None:
    """Export the device decoder's counts; without one (``--decode-device cpu``) the series are absent."""
    if decoder is not None:
        registry.register(DeviceDecodeCollector(decoder))
