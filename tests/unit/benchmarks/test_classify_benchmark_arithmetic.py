"""The classify benchmark's arithmetic: nearest-rank percentiles, throughput, and the two target verdicts."""

from __future__ import annotations

import pytest

from benchmarks.classify import Summary, percentile_ms, summarise, target_lines


def test_percentiles_are_nearest_rank_in_milliseconds():
    latencies_s = [0.004, 0.001, 0.003, 0.002]
    assert percentile_ms(latencies_s, 0.5) == pytest.approx(2.0)
    assert percentile_ms(latencies_s, 0.99) == pytest.approx(4.0)
    assert percentile_ms([0.007], 0.5) == pytest.approx(7.0)
    with pytest.raises(ValueError):
        percentile_ms([], 0.5)


def test_throughput_is_requests_over_the_rows_wall_time():
    row = summarise("warm", 100, [0.01] * 40, wall_s=2.0)
    assert (row.num_requests, row.throughput_rps, row.p50_ms) == (40, 20.0, pytest.approx(10.0))


def _rows(warm_p50_ms: float, warm_rps: float) -> list[Summary]:
    return [Summary("image-only", 1000, 10, 10.0, 20.0, 100.0), Summary("warm", 1000, 10, warm_p50_ms, 30.0, warm_rps),
            Summary("pipeline", 1000, 2, 500.0, 600.0, 2.0),
            Summary("warm", 10, 10, 99.0, 99.0, 1.0)]  # a smaller label count is not judged


def test_targets_are_judged_at_the_largest_label_count():
    met = target_lines(_rows(warm_p50_ms=12.0, warm_rps=40.0))
    assert met[0].startswith("warm p50 / image-only p50 at 1000 labels: 1.20") and met[0].endswith("met")
    assert "20.0 (target >= 20.0) met" in met[1]
    missed = target_lines(_rows(warm_p50_ms=12.5, warm_rps=39.0))
    assert missed[0].endswith("MISSED") and missed[1].endswith("MISSED")
