"""Device series on /metrics: absent on the CPU, and what the collector exports from a device's readings."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from models.device_telemetry import DeviceReading, DeviceTelemetry, StageDeviceTime
from models.loading.repository import build_preset
from server.runtime.device_metrics import DeviceMetricsCollector, register_device_metrics


def test_on_the_cpu_nothing_is_registered_and_no_batch_is_timed():
    bundle = build_preset("tiny")
    registry = CollectorRegistry()
    assert DeviceTelemetry.for_device(bundle.model.device) is None
    assert register_device_metrics(registry, bundle) is None
    assert bundle.model.device_clock is None
    assert "mmserve_device" not in generate_latest(registry).decode()


class _Readings:
    """One device's readings as the telemetry gives them (the telemetry itself needs CUDA)."""

    def __init__(self, reading: DeviceReading) -> None:
        self.reading = reading

    def read(self) -> DeviceReading:
        return self.reading

    def stage_times(self) -> dict[str, StageDeviceTime]:
        return {"vision": StageDeviceTime(4, 0.5), "text": StageDeviceTime(2, 0.01)}


def test_the_collector_exports_memory_utilization_and_batch_device_time():
    registry = CollectorRegistry()
    registry.register(DeviceMetricsCollector(_Readings(DeviceReading(1000, 4096, 37.0, 5000, 80000))))
    text = generate_latest(registry).decode()
    assert 'mmserve_device_memory_bytes{kind="allocated"} 1000.0' in text
    assert 'mmserve_device_memory_bytes{kind="reserved"} 4096.0' in text
    assert 'mmserve_device_memory_bytes{kind="total"} 80000.0' in text
    assert "mmserve_device_utilization_ratio 0.37" in text
    assert 'mmserve_device_batch_seconds_total{stage="vision"} 0.5' in text
    assert 'mmserve_device_batches_total{stage="vision"} 4.0' in text


def test_without_nvml_the_utilization_series_is_left_out_and_memory_stays():
    registry = CollectorRegistry()
    registry.register(DeviceMetricsCollector(_Readings(DeviceReading(1, 2))))
    text = generate_latest(registry).decode()
    assert 'mmserve_device_memory_bytes{kind="reserved"} 2.0' in text
    assert "utilization" not in text and 'kind="used"' not in text
