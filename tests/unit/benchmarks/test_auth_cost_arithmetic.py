"""benchmarks/auth_cost.py's arithmetic: wrk's summary, the A-B-B-A order, CPU per request and the cost."""

from __future__ import annotations

import pytest

from benchmarks.auth_cost import Run, alternated_order, cost_us, parse_wrk

WRK_OUTPUT = """\
Running 10s test @ http://127.0.0.1:8000
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    12.10ms    3.02ms  40.11ms   80.00%
    Req/Sec     1.32k   100.00     1.50k    70.00%
  13215 requests in 10.01s, 9.12MB read
  Non-2xx or 3xx responses: 7
Requests/sec:   1320.18
Transfer/sec:    933.21KB
"""


def test_wrk_summary_gives_requests_and_failures():
    assert parse_wrk(WRK_OUTPUT) == (13215, 7)
    assert parse_wrk(WRK_OUTPUT.replace("  Non-2xx or 3xx responses: 7\n", "")) == (13215, 0)
    with pytest.raises(ValueError, match="no request count"):
        parse_wrk("unable to connect to 127.0.0.1:8000 Connection refused")


def test_rounds_alternate_a_b_b_a():
    assert alternated_order(4) == [("A", "B"), ("B", "A"), ("A", "B"), ("B", "A")]


def test_cpu_per_request_and_the_cost_is_the_mean_of_per_round_differences():
    assert Run("A", 2000, 0, 1.0).cpu_us_per_request == pytest.approx(500.0)
    runs = [Run("A", 1000, 0, 0.500), Run("B", 1000, 0, 0.510),   # round 1: +10 us
            Run("B", 1000, 0, 0.530), Run("A", 1000, 0, 0.500)]   # round 2: +30 us
    mean_us, spread_us = cost_us(runs)
    assert mean_us == pytest.approx(20.0)
    assert spread_us == pytest.approx(14.142, abs=1e-3)
