"""The harness's arithmetic: A-B-B-A orders, CPU per request, sample figures and table layouts.

Every benchmark's figures pass through these; each test holds one to a value
worked out by hand, or to a property it must have.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from benchmarks.harness import (
    CpuSpent, abba_order, abba_sequence, align, cpu_ms_per_request, fixed_width, label_and_text, lag_p99_ms,
    latency_ms, ok_rate_rps, percentile_ms, ruled, run_orders,
)
from benchmarks.harness.cpu_accounting import group_cpu_s
from benchmarks.harness.process_resources import slope_per_minute
from benchmarks.loadgen.request_spec import Modality
from benchmarks.loadgen.runner import Sample

# -- the order of runs ------------------------------------------------------------------------------


def test_rounds_mirror_their_order_so_each_server_runs_first_as_often():
    assert abba_sequence("a", "b", 4) == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert [abba_order(i, "a", "b") for i in range(2)] == [("a", "b"), ("b", "a")]
    positions = [run.index("a") for run in (abba_order(i, "a", "b") for i in range(6))]
    assert positions.count(0) == positions.count(1) == 3


def test_the_fixed_rate_runs_start_with_the_other_server():
    saturation, fixed_rate = run_orders(3, "peer", "ours")
    assert saturation == ["peer", "ours", "ours", "peer", "peer", "ours"]
    assert fixed_rate == ["ours", "peer", "peer", "ours", "ours", "peer"]


# -- CPU accounting ---------------------------------------------------------------------------------


def test_cpu_per_request_is_milliseconds_per_answered_request():
    assert cpu_ms_per_request(1.5, 300) == pytest.approx(5.0)
    assert cpu_ms_per_request(0.2, 0) == pytest.approx(200.0)  # nothing answered: all of it, not a zero divide
    spent = CpuSpent(wall_s=10.0, server_s=3.0, ours_s=12.0, machine_s=17.0)
    assert spent.server_ms_per_request(600) == pytest.approx(5.0)


def test_other_processes_cpus_are_the_machines_busy_time_less_ours_over_the_wall_time():
    assert CpuSpent(wall_s=10.0, server_s=3.0, ours_s=12.0, machine_s=17.0).other_cpus == pytest.approx(0.5)
    # /proc/stat and the per-process counters tick apart: a small negative remainder is no one's CPU.
    assert CpuSpent(wall_s=10.0, server_s=3.0, ours_s=12.0, machine_s=11.9).other_cpus == 0.0


_BURN_ON_CUE = """
import sys, time
print("ready", flush=True)
sys.stdin.readline()
started_s = time.process_time()
while time.process_time() - started_s < 0.3:
    sum(range(1000))
print("burned", flush=True)
sys.stdin.readline()
"""


def test_a_process_groups_cpu_counts_what_its_processes_burned():
    # A group of its own: the test run's group also holds other workers' servers, and one of them exiting
    # between the two readings takes its CPU out of the sum.
    burner = subprocess.Popen([sys.executable, "-c", _BURN_ON_CUE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        assert burner.stdout.readline().strip() == "ready"
        before_s = group_cpu_s(burner.pid)  # a new session's group id is its leader's pid
        burner.stdin.write("go\n")
        burner.stdin.flush()
        assert burner.stdout.readline().strip() == "burned"
        assert group_cpu_s(burner.pid) - before_s >= 0.25  # clock ticks are 10 ms
    finally:
        burner.stdin.close()
        burner.wait(timeout=10)
    assert group_cpu_s(burner.pid) == 0.0  # a group with no live process


# -- figures from samples ---------------------------------------------------------------------------


def _sample(intended_s: float, sent_s: float | None, done_s: float, outcome: str = "ok") -> Sample:
    return Sample(Modality.TEXT, "text", intended_s, sent_s, done_s, 200 if outcome == "ok" else int(outcome),
                  outcome)


def test_latency_from_the_intended_time_includes_the_generators_lag():
    samples = [_sample(i * 0.01, i * 0.01 + 0.002, i * 0.01 + 0.012) for i in range(100)]
    samples.append(_sample(1.0, 1.0, 9.0, outcome="503"))  # refused: in no latency
    assert latency_ms(samples, 50) == pytest.approx(12.0)
    assert latency_ms(samples, 50, from_sent=True) == pytest.approx(10.0)
    assert lag_p99_ms(samples) == pytest.approx(2.0)


def test_answers_per_second_span_the_first_intended_send_to_the_last_answer():
    samples = [_sample(0.0, 0.0, 0.5), _sample(0.5, 0.5, 1.0), _sample(1.0, 1.0, 2.0),
               _sample(1.5, None, 1.5, outcome="503")]
    assert ok_rate_rps(samples) == pytest.approx(3 / 2.0)


def test_a_percentile_of_nothing_is_nan():
    assert math.isnan(percentile_ms([], 99))
    assert math.isnan(latency_ms([_sample(0.0, None, 1.0)], 99, from_sent=True))
    assert percentile_ms([0.001, 0.002, 0.003], 50) == pytest.approx(2.0)


def test_a_steady_climb_shows_its_slope_per_minute():
    times_s = [0.0, 5.0, 10.0, 15.0]
    assert slope_per_minute(times_s, [100.0, 110.0, 120.0, 130.0]) == pytest.approx(120.0)
    assert slope_per_minute(times_s, [7.0] * 4) == pytest.approx(0.0, abs=1e-9)
    assert math.isnan(slope_per_minute([0.0], [1.0]))


# -- table layouts ----------------------------------------------------------------------------------


def test_align_left_aligns_the_label_column_and_right_aligns_the_figures():
    assert align([("metric", "a", "b"), ("p99 ms", "12.5", "3.0")]) == ["metric     a    b",
                                                                         "p99 ms  12.5  3.0"]


def test_ruled_right_aligns_every_column_under_a_rule():
    assert ruled([("phase", "p99 ms"), ("overload 3x", "812")]).splitlines() == [
        "      phase  p99 ms",
        "-----------  ------",
        "overload 3x     812",
    ]


def test_label_and_text_pads_the_labels_and_keeps_no_trailing_space():
    assert label_and_text([("stall", ""), ("  vision", "drift after 2 periods")]).splitlines() == [
        "stall",
        "  vision  drift after 2 periods",
    ]


def test_fixed_width_right_aligns_in_equal_columns():
    assert fixed_width(("tiny", "12.5"), 6) == "  tiny   12.5"
