"""The carried counts: a departed process's counters stay in /metrics's sums, a live one is counted once.

Registries are real ``ServingMetrics``; the view is the real ``MergedMetrics`` over a real run directory,
with the snapshot files an API process writes and engine answers as an engine sends them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitoring.serving_metrics import ServingMetrics
from server.workers.counter_carry import CarriedCounts, add_into, carried_counts, monotonic_series
from server.workers.metrics_snapshots import SNAPSHOT_DIRECTORY, exemplars_of, snapshot_path
from server.workers.metrics_view import MergedMetrics, engine_series


def _metrics(requests: int, depth: int = 0, batches: int = 0) -> ServingMetrics:
    metrics = ServingMetrics(CollectorRegistry())
    for _ in range(requests):
        metrics.requests_total.labels(route="text", code="200").inc()
        metrics.request_duration_seconds.labels(route="text").observe(0.01)
    metrics.queue_depth.labels(lane="text").set(depth)
    for _ in range(batches):
        metrics.batch_size.labels(lane="text").observe(4)
    return metrics


def _answer(metrics: ServingMetrics, pid: int) -> tuple[str, dict, list, int]:
    return (generate_latest(metrics.registry).decode(), {}, exemplars_of(metrics.request_duration_seconds), pid)


def _scrape(own: ServingMetrics, answers: list, run_directory: Path) -> dict[tuple, float]:
    view = CollectorRegistry(auto_describe=False)
    view.register(MergedMetrics(own.registry, str(run_directory), lambda: answers, own.request_duration_seconds))
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(generate_latest(view).decode())
            for sample in family.samples}


def _monotonic(values: dict[tuple, float]) -> dict[tuple, float]:
    """Every series Prometheus reads as a counter: _total, _bucket, _count, _sum."""
    return {key: value for key, value in values.items()
            if key[0].endswith(("_total", "_bucket", "_count", "_sum"))}


def _assert_none_went_down(before: dict[tuple, float], after: dict[tuple, float]) -> None:
    went_down = {key: (value, after.get(key)) for key, value in _monotonic(before).items()
                 if after.get(key) is None or after[key] < value}
    assert not went_down, f"counter series that went down or vanished: {went_down}"


def _requests(values: dict[tuple, float]) -> float:
    return values[("mmserve_requests_total", (("code", "200"), ("route", "text")))]


@pytest.fixture
def departed_pid() -> int:
    """The pid of a process that ran and is gone (reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.fixture
def live_pid() -> Iterator[int]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process.pid
    process.kill()
    process.wait()


def _write_snapshot_of(run_directory: Path, pid: int, metrics: ServingMetrics) -> None:
    path = snapshot_path(str(run_directory), pid)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"text": generate_latest(metrics.registry).decode(), "exemplars": []}))


def test_monotonic_series_are_counters_histograms_and_summary_counts_not_gauges_quantiles_or_created() -> None:
    series = monotonic_series(generate_latest(_metrics(3, depth=7, batches=2).registry).decode())
    names = {name for name, _ in series}
    assert "mmserve_requests_total" in names and "mmserve_batch_size_bucket" in names
    assert "mmserve_request_duration_seconds_count" in names and "mmserve_request_duration_seconds_sum" in names
    assert "mmserve_queue_depth" not in names, "a gauge is not carried"
    assert not any(name.endswith("_created") for name in names)
    labelled = engine_series(generate_latest(_metrics(0, batches=2).registry).decode(), 1)
    assert ("mmserve_batch_size_count", (("engine", "1"), ("lane", "text"))) in labelled, \
        "an engine-labelled family is carried under its engine's label"


def test_an_engine_seen_again_under_its_pid_is_not_folded_and_a_new_pid_folds_the_old_ones_last_seen() -> None:
    state = CarriedCounts()
    state.saw_engine(1, 100, {("x_total", ()): ("x", "counter", "", 5.0)})
    state.saw_engine(1, 100, {("x_total", ()): ("x", "counter", "", 7.0)})
    assert state.departed == {}, "still alive: counted once, by its own answer"
    assert state.carried([]) == {}
    assert state.carried([1]) == {("x_total", ()): ("x", "counter", "", 7.0)}, "missed a scrape: as last seen"
    state.saw_engine(1, 200, {("x_total", ()): ("x", "counter", "", 1.0)})  # restarted under the same index
    assert state.departed == {("x_total", ()): ("x", "counter", "", 7.0)}
    assert state.carried([1]) == {("x_total", ()): ("x", "counter", "", 8.0)}
    assert CarriedCounts.from_json(json.loads(json.dumps(state.to_json()))) == state


def test_an_engines_last_seen_set_keeps_the_larger_value_when_two_scrapes_arrive_out_of_order() -> None:
    state = CarriedCounts()
    state.saw_engine(0, 100, {("x_total", ()): ("x", "counter", "", 10.0)})
    state.saw_engine(0, 100, {("x_total", ()): ("x", "counter", "", 9.0)})  # asked earlier, arrived later
    state.saw_engine(0, 101, {})
    assert state.departed == {("x_total", ()): ("x", "counter", "", 10.0)}, "not below what a scrape showed"


def test_departed_stays_one_set_of_series_however_many_restarts() -> None:
    state = CarriedCounts()
    series = engine_series(generate_latest(_metrics(2, batches=1).registry).decode(), 0)
    for pid in range(1, 51):
        state.saw_engine(0, pid, series)
    assert len(state.departed) == len(series)
    assert state.departed[("mmserve_requests_total", (("code", "200"), ("route", "text")))][3] == 49 * 2


def test_add_into_sums_series_by_series() -> None:
    total = {("a_total", ()): ("a", "counter", "", 1.0)}
    add_into(total, {("a_total", ()): ("a", "counter", "", 2.0), ("b_total", ()): ("b", "counter", "", 3.0)})
    assert total == {("a_total", ()): ("a", "counter", "", 3.0), ("b_total", ()): ("b", "counter", "", 3.0)}


def test_a_restarted_engine_never_makes_a_counter_go_down(tmp_path: Path) -> None:
    own = _metrics(2)
    first = _scrape(own, [_answer(_metrics(5, depth=3, batches=2), 100), _answer(_metrics(4), 101)], tmp_path)
    assert _requests(first) == 2 + 5 + 4
    missed = _scrape(own, [_answer(_metrics(6, batches=3), 100), None], tmp_path)  # engine 1 is restarting
    _assert_none_went_down(first, missed)
    assert _requests(missed) == 2 + 6 + 4
    assert ("mmserve_queue_depth", (("engine", "1"), ("lane", "text"))) not in missed, "its gauges are absent"
    back = _scrape(own, [_answer(_metrics(6, batches=3), 100), _answer(_metrics(1), 102)], tmp_path)
    _assert_none_went_down(missed, back)
    assert _requests(back) == 2 + 6 + 4 + 1, "the new engine's requests are counted on top of the old one's"
    restarted_0 = _scrape(own, [_answer(_metrics(0), 103), _answer(_metrics(1), 102)], tmp_path)
    _assert_none_went_down(back, restarted_0)
    assert restarted_0[("mmserve_batch_size_count", (("engine", "0"), ("lane", "text")))] == 3


def test_a_departed_api_processs_snapshot_is_folded_once_and_a_live_ones_is_read(tmp_path: Path, departed_pid: int,
                                                                                 live_pid: int) -> None:
    own = _metrics(1)
    _write_snapshot_of(tmp_path, live_pid, _metrics(10))
    _write_snapshot_of(tmp_path, departed_pid, _metrics(100))
    first = _scrape(own, [], tmp_path)
    assert _requests(first) == 1 + 10 + 100
    assert not snapshot_path(str(tmp_path), departed_pid).exists(), "folded, then removed"
    assert snapshot_path(str(tmp_path), live_pid).exists()
    _write_snapshot_of(tmp_path, live_pid, _metrics(12))
    second = _scrape(own, [], tmp_path)
    assert _requests(second) == 1 + 12 + 100, "the departed process counted once, the live one as it is now"
    _assert_none_went_down(first, second)


def test_the_answering_process_writes_the_snapshot_it_sums(tmp_path: Path) -> None:
    own = _metrics(4)
    _scrape(own, [], tmp_path)
    written = json.loads(snapshot_path(str(tmp_path), os.getpid()).read_text())
    assert monotonic_series(written["text"])[("mmserve_requests_total", (("code", "200"), ("route", "text")))][3] == 4


def test_the_carried_state_is_written_back_and_read_by_the_next_holder(tmp_path: Path) -> None:
    directory = tmp_path / SNAPSHOT_DIRECTORY
    with carried_counts(directory) as state:
        state.saw_engine(0, 1, {("x_total", ()): ("x", "counter", "doc", 2.0)})
    with carried_counts(directory) as state:
        state.saw_engine(0, 2, {})
    with carried_counts(directory) as state:
        assert state.departed == {("x_total", ()): ("x", "counter", "doc", 2.0)}
        assert state.engines == {0: (2, {})}


def _one_request_of(duration_s: float) -> ServingMetrics:
    metrics = ServingMetrics(CollectorRegistry())
    metrics.request_duration_seconds.labels(route="text").observe(duration_s)
    return metrics


def test_a_sum_that_rounds_lower_in_another_order_is_shown_at_the_value_already_shown(tmp_path: Path) -> None:
    """Floats summed in another order differ in the last bit: once engine 1 restarts, its old count is added
    first (as carried) instead of last, and 0.1 + 0.2 + 0.01 becomes 0.01 + 0.1 + 0.2, one rounding step
    lower. Prometheus reads that as a counter reset, so the view shows the larger value it showed before."""
    duration_sum = ("mmserve_request_duration_seconds_sum", (("route", "text"),))
    own = _one_request_of(0.1)
    first = _scrape(own, [_answer(_one_request_of(0.2), 100), _answer(_one_request_of(0.01), 101)], tmp_path)
    assert (0.01 + 0.1) + 0.2 < first[duration_sum], "the case this test is about: the other order is lower"
    restarted = _scrape(own, [_answer(_one_request_of(0.2), 100), _answer(ServingMetrics(CollectorRegistry()), 102)],
                        tmp_path)
    _assert_none_went_down(first, restarted)
    assert restarted[duration_sum] == first[duration_sum]
    later = _scrape(own, [_answer(_one_request_of(0.2), 100), _answer(_one_request_of(0.5), 102)], tmp_path)
    assert later[duration_sum] == pytest.approx(0.81), "a series that grows is shown as it is"


def test_the_largest_value_shown_is_kept_with_the_carried_state() -> None:
    state = CarriedCounts()
    key = ("x_sum", (("route", "text"),))
    assert state.not_below_published(key, 2.0) == 2.0
    assert state.not_below_published(key, 1.5) == 2.0
    assert state.not_below_published(key, 3.0) == 3.0
    assert CarriedCounts.from_json(json.loads(json.dumps(state.to_json()))).published == {key: 3.0}
