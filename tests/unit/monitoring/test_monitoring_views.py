"""The JSON views and the fleet merge of several replicas' digests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monitoring import DigestFormatError, ManualClock, Monitor, MonitorConfig
from monitoring.fleet import DigestSource, fleet_quantiles, format_table, main, merge_documents
from monitoring_traffic import TrafficSimulator, lognormal_ns


def replica_document(seed: int, median_s: float, n: int) -> tuple[dict, np.ndarray]:
    clock = ManualClock()
    monitor = Monitor(clock=clock)
    values = lognormal_ns(np.random.default_rng(seed), median_s, 0.5, n)
    for value in values.tolist():
        monitor.record("fusion", {"total": value})
    clock.advance(1.0)
    monitor.tick()
    return json.loads(json.dumps(monitor.digests_view(), allow_nan=False)), values


def test_drift_view_is_strict_json_in_every_state(simulator_factory) -> None:
    config = MonitorConfig(window_s=40.0, num_sub_windows=4, baseline_s=40.0, period_s=10.0, min_samples=500)
    sim: TrafficSimulator = simulator_factory(config)

    def sampler(rng, n, now_s, hits):
        return {"vision": lognormal_ns(rng, 0.02, 0.3, n)}

    views = [sim.monitor.drift_view()]
    sim.run(10, 100, sampler)
    views.append(sim.monitor.drift_view())
    sim.monitor.mark_ready()
    views.append(sim.monitor.drift_view())
    sim.run(60, 100, sampler)
    views.append(sim.monitor.drift_view())
    texts = [json.dumps(view, allow_nan=False) for view in views]  # raises on NaN
    states = [json.loads(text)["routes"].get("vision", {}).get("state") for text in texts]
    assert states == [None, "waiting_for_ready", "learning_baseline", "stable"]
    final = json.loads(texts[-1])
    assert final["baseline"]["phase"] == "frozen"
    assert final["baseline"]["learned_s"] == config.baseline_s
    route = final["routes"]["vision"]
    assert set(route["ks"]) == {"vision", "total"}
    assert route["stages"]["total"]["num_baseline"] == 40 * 100
    assert route["active"] is False


def test_fleet_quantiles_equal_the_quantiles_of_all_samples() -> None:
    first, values_a = replica_document(1, 0.010, 60_000)
    second, values_b = replica_document(2, 0.030, 40_000)
    (row,) = fleet_quantiles([first, second])
    assert (row.route, row.stage, row.num_replicas, row.count) == ("fusion", "total", 2, 100_000)
    everything = np.sort(np.concatenate([values_a, values_b]) / 1e9)
    for q, estimate in row.quantiles_s.items():
        rank = np.searchsorted(everything, estimate) / everything.size
        assert abs(rank - q) <= 1e-3
    # Averaging the replicas' own medians would be far off the fleet median.
    naive = (np.median(values_a) + np.median(values_b)) / 2e9
    assert abs(row.quantiles_s[0.5] - np.median(everything)) < abs(naive - np.median(everything)) / 10


def test_fleet_merges_lifetime_digests_and_keeps_single_replica_series() -> None:
    first, _ = replica_document(1, 0.010, 1000)
    other = json.loads(json.dumps(first))
    other["series"][0]["stage"] = "vision"
    merged = merge_documents([first, other], DigestSource.LIFETIME)
    assert {key: (digest.n_values, num) for key, (digest, num) in merged.items()} == {
        ("fusion", "total"): (1000, 1),
        ("fusion", "vision"): (1000, 1),
    }


@pytest.mark.parametrize(
    "document",
    [
        {"format": "something-else", "series": []},
        {"format": "mmserve.digests/1"},
        {"format": "mmserve.digests/1", "series": [{"route": "a"}]},
        {"format": "mmserve.digests/1", "series": [{"route": "a", "stage": "b"}]},
        {"format": "mmserve.digests/1", "series": [{"route": "a", "stage": "b", "window": {"centroids": 3}}]},
    ],
)
def test_fleet_refuses_malformed_documents(document: dict) -> None:
    with pytest.raises(DigestFormatError):
        fleet_quantiles([document])


def test_fleet_main_prints_a_table(tmp_path, capsys) -> None:
    first, _ = replica_document(1, 0.010, 5000)
    second, _ = replica_document(2, 0.010, 5000)
    paths = []
    for i, document in enumerate((first, second)):
        path = tmp_path / f"replica{i}.json"
        path.write_text(json.dumps(document))
        paths.append(str(path))
    assert main(paths) == 0
    out = capsys.readouterr().out
    header, row = out.strip().splitlines()
    assert header.split()[:4] == ["route", "stage", "replicas", "count"]
    assert row.split()[:4] == ["fusion", "total", "2", "10000"]
    assert float(row.split()[4]) == pytest.approx(10.0, rel=0.05)  # median in ms
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main([str(bad)]) == 2
    assert main([str(tmp_path / "missing.json")]) == 2
    assert format_table([]).split() == ["route", "stage", "replicas", "count", "p50", "ms", "p90", "ms",
                                        "p99", "ms", "p99.9", "ms", "p99.99", "ms"]
