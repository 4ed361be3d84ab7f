"""Exact percentiles, per-route grouping, and the generator-bottleneck flag."""

from __future__ import annotations

import asyncio
import random
import time

import numpy as np
import pytest

from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.connection_slots import ConnectionSlots
from benchmarks.loadgen.image_pool import ImageFormat, ImagePool, ImageSize
from benchmarks.loadgen.payload import BodyBuilder
from benchmarks.loadgen.report import build_report
from benchmarks.loadgen.request_spec import Arrival, Modality, RequestSpec
from benchmarks.loadgen.runner import RunResult, Sample, run_open_loop
from benchmarks.loadgen.stats import (
    PERCENTILES,
    group_stats,
    nearest_rank,
    run_windows,
    stats_by_route,
    summarize_lag,
)
from benchmarks.loadgen.text_source import TextSource


def _sample(route: str, intended_s: float, lag_s: float, latency_s: float, outcome: str = "ok") -> Sample:
    return Sample(
        modality=Modality(route),
        route=route,
        intended_s=intended_s,
        sent_s=intended_s + lag_s,
        done_s=intended_s + latency_s,
        status=200 if outcome == "ok" else int(outcome) if outcome.isdigit() else 0,
        outcome=outcome,
    )


@pytest.mark.parametrize("size", [1, 7, 100, 12_345])
def test_nearest_rank_matches_numpys_inverted_cdf(size: int) -> None:
    rng = np.random.default_rng(size)
    values = sorted(rng.lognormal(mean=1.0, sigma=1.5, size=size).tolist())
    for _, quantile in PERCENTILES:
        expected = float(np.percentile(values, quantile * 100, method="inverted_cdf"))
        assert nearest_rank(values, quantile) == expected
    assert nearest_rank([], 0.5) is None


def test_groups_count_outcomes_and_route_by_the_servers_answer() -> None:
    rng = random.Random(0)
    samples = [
        _sample(rng.choice(["text", "vision", "fusion"]), i * 0.01, 0.0005, rng.uniform(0.001, 0.2)) for i in range(300)
    ]
    samples += [_sample("vision", 1.0, 0.001, 0.05, "503"), _sample("text", 1.1, 0.001, 2.0, "client_timeout")]
    result = RunResult(tuple(samples), started_at_s=0.0, schedule_window_s=3.0)
    windows = run_windows(result)
    overall = group_stats(result.samples, windows)
    assert overall.sent == len(samples) and overall.ok == len(samples) - 2
    assert overall.errors_by_status == {"503": 1, "client_timeout": 1}
    assert overall.achieved_rate_rps == pytest.approx(len(samples) / 3.0)
    latencies_ms = sorted(s.latency_s * 1000.0 for s in samples)
    assert dict(overall.latency.percentiles_ms)["p99_ms"] == nearest_rank(latencies_ms, 0.99)
    by_route = stats_by_route(result.samples, windows)
    assert {route: stats.sent for route, stats in by_route.items()} == {
        route: sum(1 for s in samples if s.route == route) for route in ("fusion", "text", "vision")
    }
    assert by_route["vision"].errors_by_status == {"503": 1}


def _config(max_lag_p99_ms: float) -> BenchConfig:
    return BenchConfig(
        url="http://127.0.0.1:9", mode=RunMode.OPEN, duration_s=1.0, rate_rps=100.0, max_lag_p99_ms=max_lag_p99_ms
    )


def test_report_flags_a_lagging_generator_and_warns() -> None:
    on_time = [_sample("text", i * 0.01, 0.0002, 0.003) for i in range(200)]
    late = on_time[:190] + [_sample("text", 2.0 + i * 0.01, 0.040, 0.045) for i in range(10)]
    calm = build_report(_config(10.0), RunResult(tuple(on_time), 0.0, 2.0), server={})
    assert calm["generator_bottleneck"] is False and calm["warnings"] == []
    flagged = build_report(_config(10.0), RunResult(tuple(late), 0.0, 2.0), server={})
    assert flagged["generator_lag_ms"]["p99"] == pytest.approx(40.0)
    assert flagged["generator_bottleneck"] is True
    assert any("generator" in warning and "lag" in warning for warning in flagged["warnings"])
    assert summarize_lag(late).max_ms == pytest.approx(40.0)


class _SlowBodyBuilder(BodyBuilder):
    """A sender that cannot keep up: every body costs 15 ms of CPU, at 4 ms between arrivals."""

    def build(self, spec: RequestSpec) -> bytes:
        deadline_s = time.perf_counter() + 0.015
        while time.perf_counter() < deadline_s:
            pass
        return super().build(spec)


def test_a_generator_that_cannot_keep_up_is_caught(standin) -> None:
    builder = _SlowBodyBuilder(ImagePool(0, ImageSize(8, 8), ImageFormat.PNG), TextSource(0))
    arrivals = [Arrival(i * 0.004, RequestSpec(Modality.TEXT, num_text_chars=20)) for i in range(40)]

    async def go() -> RunResult:
        slots = ConnectionSlots(standin.url, timeout_s=5.0)
        try:
            return await run_open_loop(slots, iter(arrivals), builder, schedule_window_s=0.16, timeout_s=5.0)
        finally:
            await slots.aclose()

    result = asyncio.run(go())
    report = build_report(_config(10.0), result, server={})
    assert report["ok"] == len(arrivals)
    # 40 bodies x 15 ms = 0.6 s of work for a 0.16 s schedule: the last sends are ~0.4 s late.
    assert report["generator_lag_ms"]["max"] > 300.0
    assert report["generator_bottleneck"] is True
    # Latency is still measured from the intended time, so the lag is part of it, not hidden.
    assert report["max_ms"] >= report["generator_lag_ms"]["max"]
