"""Accuracy of what the digests report: quantiles to P99.99, KS distance, JSON round trip.

Samples go through the real path (``Monitor.record`` -> fold -> sub-window
digests -> merged window / lifetime), and every number is compared with the
exact answer computed from the raw samples.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import tdigest

from monitoring import ManualClock, Monitor, MonitorConfig
from monitoring.digest import digest_from_json, digest_to_json, ks_distance, new_digest, quantiles_of
from monitoring.errors import DigestFormatError
from monitoring_traffic import TrafficSimulator

QUANTILES = (0.5, 0.9, 0.99, 0.999, 0.9999)
NUM_SAMPLES = 1_000_000


def rank_errors(sorted_values: np.ndarray, estimates: list[float], qs: tuple[float, ...]) -> np.ndarray:
    """``|F_n(estimate) - q|`` per quantile, with ties counted at their mid-rank."""
    left = np.searchsorted(sorted_values, estimates, side="left")
    right = np.searchsorted(sorted_values, estimates, side="right")
    return np.abs((left + right) / 2 / sorted_values.size - np.asarray(qs))


def exact_ks(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.sort(a), np.sort(b)
    points = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, points, side="right") / a.size
    cdf_b = np.searchsorted(b, points, side="right") / b.size
    return float(np.max(np.abs(cdf_a - cdf_b)))


# A sample goes into one cell (batch-size bucket x cache outcome) and all traffic is
# merged from cells when read: with no segments recorded everything is one cell; with
# both, twelve cells of uneven sizes, from 3 % to 23 % of the traffic. Seed 20 is a draw on
# which compressing to max_centroids at every merge (no headroom, see monitoring.series)
# reads the Pareto median 4e-4 to 5e-4 off in rank.
CELL_LAYOUTS = {
    "one cell": (42, None, None),
    "twelve cells": (20, (1, 2, 3, 4, 8, 16, 32), (True, False, False, False, False)),
}


@pytest.fixture(scope="module", params=sorted(CELL_LAYOUTS))
def heavy_tailed_monitor(request: pytest.FixtureRequest) -> tuple[Monitor, dict[str, np.ndarray]]:
    """A monitor fed 10^6 lognormal and 10^6 Pareto samples over 10 sub-windows of its window."""
    seed, batch_sizes, cache_hits = CELL_LAYOUTS[request.param]
    rng = np.random.default_rng(seed)
    samples_ns = {
        "lognormal": rng.lognormal(np.log(20e6), 1.0, NUM_SAMPLES).astype(np.int64),
        "pareto": ((rng.pareto(1.5, NUM_SAMPLES) + 1.0) * 2e6).astype(np.int64),  # alpha 1.5: infinite variance
    }
    clock = ManualClock()
    config = MonitorConfig(window_s=120.0, num_sub_windows=12)
    monitor = Monitor(config, clock=clock)
    record = monitor.record
    per_sub_window = NUM_SAMPLES // 10
    for part in range(10):
        chunk = slice(part * per_sub_window, (part + 1) * per_sub_window)
        values = zip(samples_ns["lognormal"][chunk].tolist(), samples_ns["pareto"][chunk].tolist())
        if batch_sizes is None:
            for a, b in values:
                record("route", {"lognormal": a, "pareto": b})
        else:
            segments = zip(itertools.cycle(batch_sizes), itertools.cycle(cache_hits))
            for (a, b), (batch_size, cache_hit) in zip(values, segments):
                record("route", {"lognormal": a, "pareto": b}, batch_size=batch_size, cache_hit=cache_hit)
        clock.advance(config.sub_window_s)
        monitor.tick()
    return monitor, {stage: np.sort(values) / 1e9 for stage, values in samples_ns.items()}


@pytest.mark.parametrize("stage", ["lognormal", "pareto"])
@pytest.mark.parametrize("source", ["window", "lifetime"])
def test_quantiles_to_p9999_within_1e4_rank_error(heavy_tailed_monitor, stage: str, source: str) -> None:
    monitor, exact_sorted_s = heavy_tailed_monitor
    series = next(s for s in monitor.digests_view()["series"] if s["stage"] == stage)
    digest = digest_from_json(series[source])
    assert digest.n_values == NUM_SAMPLES
    errors = rank_errors(exact_sorted_s[stage], quantiles_of(digest, QUANTILES), QUANTILES)
    assert errors.max() <= 1e-4, dict(zip(QUANTILES, errors))


def test_exported_window_quantiles_are_as_accurate(heavy_tailed_monitor) -> None:
    """The path the Prometheus summary reads; judged by rank, as a heavy tail must be."""
    monitor, exact_sorted_s = heavy_tailed_monitor
    for stage in ("lognormal", "pareto"):
        estimates = monitor.window_quantiles_s("route", stage, QUANTILES)
        assert rank_errors(exact_sorted_s[stage], estimates, QUANTILES).max() <= 1e-4


@pytest.mark.parametrize("is_segmented", [False, True], ids=["one cell", "ten cells"])
@pytest.mark.parametrize(
    ("median_factor", "mixture_fraction"),
    [(1.0, 0.0), (1.03, 0.0), (1.0, 0.1), (1.2, 0.03)],
)
def test_ks_from_window_and_baseline_digests_matches_exact(
    simulator_factory, median_factor: float, mixture_fraction: float, is_segmented: bool
) -> None:
    config = MonitorConfig(window_s=60.0, num_sub_windows=6, baseline_s=60.0, period_s=10.0, min_samples=1000)
    sim: TrafficSimulator = simulator_factory(config, seed=9)

    def baseline(rng, n, now_s, hits):
        return {"vision": rng.lognormal(np.log(20e6), 0.4, n).astype(np.int64)}

    def shifted(rng, n, now_s, hits):
        values = rng.lognormal(np.log(20e6 * median_factor), 0.4, n)
        values = np.where(rng.random(n) < mixture_fraction, values + 15e6, values)
        return {"vision": values.astype(np.int64)}

    segments = {"batch_sizes": np.array([1, 2, 4, 8, 16]), "cache_hit_ratio": 0.6} if is_segmented else {}
    sim.run(10, 2000, baseline, **segments)
    sim.monitor.mark_ready()
    baseline_seconds = sim.run(60, 2000, baseline, **segments)
    window_seconds = sim.run(60, 2000, shifted, **segments)
    # After the tick at +120 s the window is the last five closed sub-windows: seconds 10..59 of this run.
    exact = exact_ks(
        np.concatenate([s["vision"] for s in window_seconds[10:]]),
        np.concatenate([s["vision"] for s in baseline_seconds]),
    )
    verdict = sim.monitor.drift_status()["vision"].verdicts["vision"]
    assert verdict.num_window == 50 * 2000 and verdict.num_baseline == 60 * 2000
    assert verdict.ks == pytest.approx(exact, abs=0.005)


def test_cross_check_against_pure_python_tdigest() -> None:
    rng = np.random.default_rng(3)
    values_s = rng.lognormal(np.log(0.02), 0.8, 20_000)
    fast = new_digest(2000)
    fast.batch_update(values_s)
    reference = tdigest.TDigest()
    reference.batch_update(values_s)
    exact_sorted = np.sort(values_s)
    qs = (0.5, 0.9, 0.99, 0.999)
    fast_errors = rank_errors(exact_sorted, quantiles_of(fast, qs), qs)
    reference_errors = rank_errors(exact_sorted, [reference.percentile(q * 100) for q in qs], qs)
    assert fast_errors.max() <= 2e-4
    assert reference_errors.max() <= 2e-3
    assert fast_errors.max() <= reference_errors.max() + 1e-4


def test_json_round_trip_is_lossless() -> None:
    rng = np.random.default_rng(5)
    digest = new_digest(500)
    digest.batch_update(rng.lognormal(0.0, 1.0, 100_000))
    text = json.dumps(digest_to_json(digest), allow_nan=False)
    restored = digest_from_json(json.loads(text))
    assert restored.n_values == digest.n_values
    assert restored.max_centroids == 500
    assert (restored.min(), restored.max(), restored.sum()) == (digest.min(), digest.max(), digest.sum())
    qs = [0.001, 0.5, 0.99, 0.9999]
    assert restored.quantile_vec(qs) == digest.quantile_vec(qs)
    assert ks_distance(restored, digest) == 0.0
    empty = digest_from_json(json.loads(json.dumps(digest_to_json(new_digest(100)), allow_nan=False)))
    assert empty.is_empty() and empty.max_centroids == 100


@pytest.mark.parametrize(
    "document",
    [
        [],
        {"centroids": []},
        {"max_centroids": "2000", "centroids": []},
        {"max_centroids": 100, "centroids": [[1.0]]},
        {"max_centroids": 100, "centroids": [[1.0, -1.0]]},
        {"max_centroids": 100, "centroids": [[1.0, 1.0]], "min": "low"},
        {"max_centroids": 100, "centroids": [[float("nan"), 1.0]]},
    ],
)
def test_malformed_digest_documents_are_refused(document: object) -> None:
    with pytest.raises(DigestFormatError):
        digest_from_json(document)  # type: ignore[arg-type]


def test_ks_is_zero_for_a_constant_stage_stored_differently() -> None:
    """A constant time is an atom; two digests may round its mean differently by one ulp."""
    one_pass = new_digest(2000)
    one_pass.batch_update(np.full(33_000, 0.0005))
    many_passes = new_digest(2000)
    for _ in range(20):
        many_passes.batch_update(np.full(9_000, 0.0005))
    assert ks_distance(one_pass, many_passes) == 0.0
