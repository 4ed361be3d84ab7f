"""The scrape-time collector: parse what ``generate_latest`` writes and check every value."""

from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitoring import SUMMARY_QUANTILES, ManualClock, Monitor, MonitorConfig, ServingMetrics
from monitoring_traffic import lognormal_ns


def scrape(registry: CollectorRegistry) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(generate_latest(registry).decode())}


def exact_rank_error(sorted_values: np.ndarray, estimate: float, q: float) -> float:
    left = np.searchsorted(sorted_values, estimate, side="left")
    right = np.searchsorted(sorted_values, estimate, side="right")
    return abs((left + right) / 2 / sorted_values.size - q)


@pytest.fixture
def fed_monitor() -> tuple[Monitor, ManualClock, dict[tuple[str, str], np.ndarray]]:
    """Two routes, three sub-windows of traffic; returns the raw ns per (route, stage)."""
    clock = ManualClock()
    monitor = Monitor(MonitorConfig(window_s=60.0, num_sub_windows=6), clock=clock)
    rng = np.random.default_rng(11)
    raw: dict[tuple[str, str], list[np.ndarray]] = {}
    for _ in range(3):
        for route, median_s, n in (("text", 0.004, 30_000), ("vision", 0.025, 20_000)):
            queue = rng.lognormal(np.log(0.001e9), 0.6, n).astype(np.int64)
            model = rng.lognormal(np.log(median_s * 1e9), 0.3, n).astype(np.int64)
            total = queue + model
            for q, m, t in zip(queue.tolist(), model.tolist(), total.tolist()):
                monitor.record(route, {"queue": q, route: m, "total": t})
            for stage, values in (("queue", queue), (route, model), ("total", total)):
                raw.setdefault((route, stage), []).append(values)
        clock.advance(10.0)
        monitor.tick()
    return monitor, clock, {key: np.concatenate(parts) for key, parts in raw.items()}


def test_summary_has_five_quantiles_sum_and_count(fed_monitor) -> None:
    monitor, _, raw = fed_monitor
    registry = CollectorRegistry()
    monitor.register(registry)
    family = scrape(registry)["mmserve_stage_latency_seconds"]
    assert family.type == "summary"
    by_series: dict[tuple[str, str], dict[str, float]] = {}
    for sample in family.samples:
        key = (sample.labels["route"], sample.labels["stage"])
        name = sample.labels.get("quantile", sample.name.rsplit("_", 1)[-1])
        by_series.setdefault(key, {})[name] = sample.value
    assert set(by_series) == set(raw)
    for key, values_ns in raw.items():
        exported = by_series[key]
        assert set(exported) == {*(str(q) for q in SUMMARY_QUANTILES), "sum", "count"}
        assert exported["count"] == values_ns.size
        assert exported["sum"] == pytest.approx(values_ns.sum() / 1e9, rel=1e-9)
        sorted_s = np.sort(values_ns) / 1e9
        for q in SUMMARY_QUANTILES:
            assert exact_rank_error(sorted_s, exported[str(q)], q) <= 1e-4


def test_quantiles_follow_the_window_while_sum_and_count_keep_counting(fed_monitor) -> None:
    monitor, clock, raw = fed_monitor
    registry = CollectorRegistry()
    monitor.register(registry)
    clock.advance(70.0)  # every sub-window with traffic has left the window
    monitor.tick()
    family = scrape(registry)["mmserve_stage_latency_seconds"]
    values = {
        (s.labels["route"], s.labels["stage"], s.labels.get("quantile", s.name)): s.value for s in family.samples
    }
    assert all(math.isnan(values[("text", "total", str(q))]) for q in SUMMARY_QUANTILES)
    assert values[("text", "total", "mmserve_stage_latency_seconds_count")] == raw[("text", "total")].size


def test_drift_series_are_exported(fed_monitor) -> None:
    monitor, clock, _ = fed_monitor
    registry = CollectorRegistry()
    monitor.register(registry)
    families = scrape(registry)
    assert [s.value for s in families["mmserve_drift_active"].samples] == [0.0, 0.0]
    assert families["mmserve_drift_ks_statistic"].samples == []  # no baseline yet, nothing judged
    monitor.mark_ready()
    rng = np.random.default_rng(12)
    for _ in range(int((monitor.config.baseline_s + 2 * monitor.config.period_s) / 10)):
        for value in rng.lognormal(np.log(0.004e9), 0.3, 1000).astype(np.int64).tolist():
            monitor.record("text", {"queue": value // 4, "text": value, "total": value + value // 4})
        clock.advance(10.0)
        monitor.tick()
    families = scrape(registry)
    ks = {(s.labels["route"], s.labels["stage"]): s.value for s in families["mmserve_drift_ks_statistic"].samples}
    statuses = monitor.drift_status()
    expected = {
        (route, stage): verdict.ks
        for route, status in statuses.items()
        for stage, verdict in status.verdicts.items()
        if not math.isnan(verdict.ks)
    }
    assert set(ks) == {("text", "queue"), ("text", "text"), ("text", "total")}
    assert ks == expected
    assert all(0 <= value < 1 for value in ks.values())


def test_registration_does_not_scrape_and_registries_stay_apart() -> None:
    calls = []
    monitor = Monitor(clock=ManualClock())
    original = monitor.export_snapshot

    def counting_snapshot():
        calls.append(1)
        return original()

    monitor.export_snapshot = counting_snapshot  # type: ignore[method-assign]
    first, second = CollectorRegistry(), CollectorRegistry()
    ServingMetrics(first)
    monitor.register(first)
    assert calls == []  # describe() answered the registry, collect() did not run
    monitor.record("text", {"total": 1_000_000})
    monitor.tick()
    assert "mmserve_stage_latency_seconds" in scrape(first)
    assert "mmserve_stage_latency_seconds" not in scrape(second)
    assert len(calls) == 1


def test_dropped_records_are_counted_and_exported() -> None:
    monitor = Monitor(MonitorConfig(max_buffered_records=3), clock=ManualClock())
    registry = CollectorRegistry()
    monitor.register(registry)
    for _ in range(5):
        monitor.record("text", {"total": 1000})
    assert monitor.num_dropped_records == 2
    monitor.tick()
    families = scrape(registry)
    assert families["mmserve_monitor_dropped_records"].samples[0].value == 2.0
    count = [s for s in families["mmserve_stage_latency_seconds"].samples if s.name.endswith("_count")]
    assert [s.value for s in count] == [3.0]


def baseline_gauges(registry: CollectorRegistry) -> dict[str, dict[str, float]]:
    """``{route: {"samples", "min_samples", "frozen"}}`` from the ``mmserve_drift_baseline_*`` families."""
    families = scrape(registry)
    gauges: dict[str, dict[str, float]] = {}
    for key in ("samples", "min_samples", "frozen"):
        family = families[f"mmserve_drift_baseline_{key}"]
        assert family.type == "gauge"
        for sample in family.samples:
            assert set(sample.labels) == {"route"}
            gauges.setdefault(sample.labels["route"], {})[key] = sample.value
    return gauges


def steady_text(rng: np.random.Generator, n: int, now_s: float, hits: np.ndarray | None) -> dict[str, np.ndarray]:
    return {"queue": lognormal_ns(rng, 0.001, 0.5, n), "text": lognormal_ns(rng, 0.004, 0.3, n)}


def test_baseline_gauges_follow_a_baseline_as_traffic_fills_it(simulator_factory, small_config: MonitorConfig) -> None:
    """An idle start: the route learns past baseline_s, its samples grow, and frozen turns 1 once they suffice."""
    sim = simulator_factory(small_config, seed=21, route="text")
    registry = CollectorRegistry()
    sim.monitor.register(registry)
    assert baseline_gauges(registry) == {}  # no route seen yet: no series
    sim.monitor.mark_ready()
    sim.run(2 * int(small_config.baseline_s), 0, steady_text)  # idle past baseline_s
    sim.run(int(small_config.baseline_s), 5, steady_text)  # a trickle: 300 samples of the 2000 needed
    assert baseline_gauges(registry) == {"text": {"samples": 300.0, "min_samples": 2000.0, "frozen": 0.0}}
    sim.run(10, 300, steady_text)  # 3000 more, of which the closed sub-windows' suffice
    (gauges,) = baseline_gauges(registry).values()
    baseline = sim.monitor.baselines()["text"]
    assert baseline.is_frozen and baseline.num_samples >= small_config.min_samples
    assert gauges == {"samples": float(baseline.num_samples), "min_samples": 2000.0, "frozen": 1.0}
    sim.monitor.relearn_baseline()  # forgotten: learning again, from nothing
    assert baseline_gauges(registry) == {"text": {"samples": 0.0, "min_samples": 2000.0, "frozen": 0.0}}
