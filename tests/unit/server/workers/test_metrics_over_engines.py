"""One /metrics over several engines: counts summed, per-engine series labelled, a missing engine's gauges left out.

Each engine's exposition is what a real engine registry writes (``ServingMetrics``, a registered
``Monitor``, the device collector), and the sockets test asks real Unix-socket servers that answer
``("metrics", id)`` frames as ``server.workers.engine_process`` does.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from models.device_telemetry import DeviceReading, StageDeviceTime
from monitoring import Monitor
from monitoring.serving_metrics import ServingMetrics
from server.runtime.device_metrics import DeviceMetricsCollector
from server.workers.frames import encode_frame, read_messages
from server.workers.metrics_snapshots import exemplars_of
from server.workers.metrics_view import ENGINE_LABELLED_FAMILIES, MergedMetrics, merged_registry
from server.workers.restarts import register_single_process_worker_series, write_engine_restart_count


class _Device:
    """One engine's device readings (the collector's input on CUDA)."""

    def __init__(self, allocated_bytes: int, utilization_percent: float, batches: int, seconds: float) -> None:
        self._reading = DeviceReading(allocated_bytes, 2 * allocated_bytes, utilization_percent, 3, 4)
        self._times = {"vision": StageDeviceTime(batches, seconds)}

    def read(self) -> DeviceReading:
        return self._reading

    def stage_times(self) -> dict[str, StageDeviceTime]:
        return self._times


class _Engine:
    """An engine's registry as the engine process builds it, with some traffic on it."""

    def __init__(self, *, requests: int, depth: int, batches: list[int], cache_bytes: int, hits: int,
                 latency_s: float, device: _Device) -> None:
        self.registry = CollectorRegistry()
        self.metrics = ServingMetrics(self.registry)
        self.monitor = Monitor()
        self.monitor.register(self.registry)
        self.registry.register(DeviceMetricsCollector(device))
        self.metrics.model_info.labels(runtime="torch", dtype="float32").set(1)
        for _ in range(requests):
            self.metrics.requests_total.labels(route="classify", code="200").inc()
            self.metrics.request_duration_seconds.labels(route="classify").observe(latency_s)
            self.monitor.record("vision", {"total": int(latency_s * 1e9)})
        self.monitor.tick()
        self.metrics.queue_depth.labels(lane="vision").set(depth)
        for size in batches:
            self.metrics.batch_size.labels(lane="vision").observe(size)
        self.metrics.cache_bytes.labels(modality="image").set(cache_bytes)
        self.metrics.cache_entries.labels(modality="image").set(cache_bytes // 1000)
        self.metrics.cache_events_total.labels(modality="image", event="hit").inc(hits)

    def answer(self) -> tuple[str, dict, list, int]:
        """What the engine answers ``("metrics", id)`` with."""
        return (generate_latest(self.registry).decode(), self.monitor.digests_view(),
                exemplars_of(self.metrics.request_duration_seconds), id(self))


def _engines() -> list[_Engine]:
    # Engine 0's monitor sees fast requests, engine 1's slow ones: merged quantiles must be engine 0's alone.
    return [_Engine(requests=3, depth=2, batches=[1, 2], cache_bytes=5000, hits=4, latency_s=0.002,
                    device=_Device(1_000, 40.0, 2, 0.02)),
            _Engine(requests=5, depth=9, batches=[8, 8, 8], cache_bytes=7000, hits=6, latency_s=0.4,
                    device=_Device(3_000, 90.0, 4, 0.2))]


def _api_process(requests: int) -> ServingMetrics:
    metrics = ServingMetrics(CollectorRegistry())
    for _ in range(requests):
        metrics.requests_total.labels(route="vision", code="200").inc()
        metrics.request_duration_seconds.labels(route="vision").observe(0.01)
    return metrics


def _view(api: ServingMetrics, answers: list, run_directory: Path) -> CollectorRegistry:
    view = CollectorRegistry(auto_describe=False)
    view.register(MergedMetrics(api.registry, str(run_directory), lambda: answers, api.request_duration_seconds))
    return view


def _values(view: CollectorRegistry) -> dict[tuple, float]:
    """``{(sample name, sorted labels): value}`` of the classic text the view encodes (as Prometheus reads it)."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(generate_latest(view).decode())
            for sample in family.samples}


def _of(values: dict[tuple, float], name: str) -> dict[tuple, float]:
    return {labels: value for (sample, labels), value in values.items() if sample == name}


def test_counts_over_two_engines_and_an_api_process_are_summed(tmp_path: Path) -> None:
    engines = _engines()
    values = _values(_view(_api_process(7), [engine.answer() for engine in engines], tmp_path))
    assert _of(values, "mmserve_requests_total") == {
        (("code", "200"), ("route", "classify")): 3 + 5,  # the engines' (zero-shot routes count there)
        (("code", "200"), ("route", "vision")): 7,
    }
    assert _of(values, "mmserve_request_duration_seconds_count")[(("route", "classify"),)] == 8
    assert _of(values, "mmserve_cache_events_total") == {(("event", "hit"), ("modality", "image")): 10}
    device_batches = _of(values, "mmserve_device_batches_total")
    assert device_batches == {(("engine", "0"), ("stage", "vision")): 2, (("engine", "1"), ("stage", "vision")): 4}
    assert _of(values, "mmserve_model_info") == {(("dtype", "float32"), ("runtime", "torch")): 1}


def test_each_engines_series_keep_their_own_engine_label(tmp_path: Path) -> None:
    engines = _engines()
    values = _values(_view(_api_process(1), [engine.answer() for engine in engines], tmp_path))
    assert _of(values, "mmserve_queue_depth") == {(("engine", "0"), ("lane", "vision")): 2,
                                                  (("engine", "1"), ("lane", "vision")): 9}
    assert _of(values, "mmserve_cache_bytes") == {(("engine", "0"), ("modality", "image")): 5000,
                                                  (("engine", "1"), ("modality", "image")): 7000}
    assert _of(values, "mmserve_cache_entries") == {(("engine", "0"), ("modality", "image")): 5,
                                                    (("engine", "1"), ("modality", "image")): 7}
    assert _of(values, "mmserve_batch_size_count") == {(("engine", "0"), ("lane", "vision")): 2,
                                                       (("engine", "1"), ("lane", "vision")): 3}
    assert _of(values, "mmserve_batch_size_sum") == {(("engine", "0"), ("lane", "vision")): 3,
                                                     (("engine", "1"), ("lane", "vision")): 24}
    assert _of(values, "mmserve_device_utilization_ratio") == {(("engine", "0"),): 0.4, (("engine", "1"),): 0.9}
    allocated = {labels: value for labels, value in _of(values, "mmserve_device_memory_bytes").items()
                 if ("kind", "allocated") in labels}
    assert allocated == {(("engine", "0"), ("kind", "allocated")): 1000,
                         (("engine", "1"), ("kind", "allocated")): 3000}
    # Every labelled family's samples carry the label, _created included; none of the others do.
    for (name, labels), _ in values.items():
        family = next((f for f in ENGINE_LABELLED_FAMILIES if name.startswith(f)), None)
        assert (family is not None) == ("engine" in dict(labels)), (name, labels)


def test_one_engine_is_labelled_engine_0(tmp_path: Path) -> None:
    (engine, _) = _engines()
    values = _values(_view(_api_process(1), [engine.answer()], tmp_path))
    assert _of(values, "mmserve_queue_depth") == {(("engine", "0"), ("lane", "vision")): 2}


def test_an_engine_that_does_not_answer_keeps_only_its_last_seen_counts_in_the_scrape(tmp_path: Path) -> None:
    engines = _engines()
    never_seen = _values(_view(_api_process(1), [engines[0].answer(), None], tmp_path))
    assert _of(never_seen, "mmserve_requests_total")[(("code", "200"), ("route", "classify"))] == 3
    assert _of(never_seen, "mmserve_queue_depth") == {(("engine", "0"), ("lane", "vision")): 2}
    assert _of(never_seen, "mmserve_stage_latency_seconds"), "engine 0 answered: its quantiles are there"
    without_0 = _values(_view(_api_process(1), [None, engines[1].answer()], tmp_path))
    assert _of(without_0, "mmserve_requests_total")[(("code", "200"), ("route", "classify"))] == 3 + 5, \
        "engine 0's 3 as last seen: a counter does not dip for the scrape it misses"
    assert _of(without_0, "mmserve_device_batches_total") == {(("engine", "0"), ("stage", "vision")): 2,
                                                              (("engine", "1"), ("stage", "vision")): 4}
    assert _of(without_0, "mmserve_queue_depth") == {(("engine", "1"), ("lane", "vision")): 9}, \
        "a missing engine's gauges are absent"
    assert _of(without_0, "mmserve_stage_latency_seconds") == {}, "quantiles come from engine 0's monitor only"


def test_stage_quantiles_come_from_engine_0s_digests_only(tmp_path: Path) -> None:
    engines = _engines()
    values = _values(_view(_api_process(1), [engine.answer() for engine in engines], tmp_path))
    p99 = _of(values, "mmserve_stage_latency_seconds")[(("quantile", "0.99"), ("route", "vision"), ("stage", "total"))]
    assert p99 == pytest.approx(0.002, rel=0.05), "engine 1's slow digests would have made it 0.4"


def test_the_merged_view_with_engine_labels_encodes_as_strict_openmetrics(tmp_path: Path) -> None:
    view = _view(_api_process(2), [engine.answer() for engine in _engines()], tmp_path)
    parsed = {family.name: family for family in parse_openmetrics(generate_openmetrics(view).decode())}
    created = {sample.labels["engine"] for sample in parsed["mmserve_batch_size"].samples
               if sample.name == "mmserve_batch_size_created"}
    assert created == {"0", "1"}
    assert "mmserve_batch_size_created" not in parsed


class _FakeEngines:
    """Unix-socket servers in a thread of their own, answering ``("metrics", id)`` as the engine does."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._servers: list[asyncio.AbstractServer] = []

    def serve(self, path: Path, answer: tuple | None) -> None:
        """Answer every metrics call at ``path`` with ``answer``; with None, close each connection unanswered."""

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                for kind, call_id, *_ in await read_messages(reader):
                    if kind == "metrics" and answer is not None:
                        writer.write(encode_frame(("ok", call_id, answer)))
                        await writer.drain()
            finally:
                writer.close()

        async def start() -> asyncio.AbstractServer:
            return await asyncio.start_unix_server(handle, path=str(path))

        self._servers.append(asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=10))

    def close(self) -> None:
        async def stop() -> None:
            for server in self._servers:
                server.close()
                await server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@pytest.fixture
def fake_engines() -> Iterator[_FakeEngines]:
    engines = _FakeEngines()
    yield engines
    engines.close()


def test_merged_registry_asks_every_engine_socket_and_leaves_out_those_that_do_not_answer(
        tmp_path: Path, fake_engines: _FakeEngines) -> None:
    engines = _engines()
    sockets = [tmp_path / f"engine-{index}.sock" for index in range(4)]
    fake_engines.serve(sockets[0], engines[0].answer())
    fake_engines.serve(sockets[1], engines[1].answer())
    fake_engines.serve(sockets[2], None)  # accepts, then breaks the connection
    refusing = sockets[3]  # a socket file nobody listens on: connection refused
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(str(refusing))
    api = _api_process(4)
    view = merged_registry(api.registry, str(tmp_path), [str(path) for path in sockets]
                           + [str(tmp_path / "engine-9.sock")],  # no file at all
                           api.request_duration_seconds)
    values = _values(view)
    assert _of(values, "mmserve_requests_total")[(("code", "200"), ("route", "classify"))] == 8
    assert _of(values, "mmserve_queue_depth") == {(("engine", "0"), ("lane", "vision")): 2,
                                                  (("engine", "1"), ("lane", "vision")): 9}
    p99 = _of(values, "mmserve_stage_latency_seconds")[(("quantile", "0.99"), ("route", "vision"), ("stage", "total"))]
    assert p99 == pytest.approx(0.002, rel=0.05)
    assert _of(values, "mmserve_engine_restarts_total") == {(): 0}
    write_engine_restart_count(str(tmp_path), 3)
    assert _of(_values(view), "mmserve_engine_restarts_total") == {(): 3}
    assert not os.path.exists(tmp_path / "engine-9.sock")


def test_a_single_process_registry_in_an_engine_is_not_exported_twice(
        tmp_path: Path, fake_engines: _FakeEngines) -> None:
    """An engine built as a one-process app registers the restart counts and the live gauge itself (at 0 and 1);
    the view's own, read from the run directory, are the ones exported, once each."""
    engine = _engines()[0]
    register_single_process_worker_series(engine.registry)
    fake_engines.serve(tmp_path / "engine-0.sock", engine.answer())
    write_engine_restart_count(str(tmp_path), 2)
    api = _api_process(1)
    view = merged_registry(api.registry, str(tmp_path), [str(tmp_path / "engine-0.sock")],
                           api.request_duration_seconds)
    exported = generate_latest(view).decode()
    assert exported.count("# TYPE mmserve_engine_restarts_total counter") == 1
    assert exported.count("# TYPE mmserve_api_worker_restarts_total counter") == 1
    assert exported.count("# TYPE mmserve_api_workers_live gauge") == 1
    assert "mmserve_engine_restarts_total 2.0" in exported
    assert 'mmserve_queue_depth{engine="0",lane="vision"} 2.0' in exported


def test_a_single_process_server_exports_the_engine_restart_count_at_0() -> None:
    registry = CollectorRegistry()
    register_single_process_worker_series(registry)
    values = {sample.name: sample.value for family in registry.collect() for sample in family.samples}
    assert values["mmserve_engine_restarts_total"] == 0
    assert values["mmserve_api_worker_restarts_total"] == 0
    assert values["mmserve_api_workers_live"] == 1
