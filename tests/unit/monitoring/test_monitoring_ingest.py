"""Folding hot-path records into per-series arrays, and the config's validation."""

from __future__ import annotations

import dataclasses
import time

import pytest

from monitoring import InvalidMonitorConfigError, ManualClock, Monitor, MonitorConfig
from monitoring.ingest import CellKey, batch_size_bucket, fold_records


def test_records_are_grouped_per_cell() -> None:
    """Each sample lands in exactly one cell: (route, stage, batch-size bucket, cache outcome)."""
    records = [
        ("fusion", {"vision": 2_000_000, "total": 3_000_000}, 8, False, None),
        ("fusion", {"vision": 4_000_000, "total": 5_000_000}, 8, True, None),
        ("fusion", {"total": 7_000_000, "vision": 6_000_000}, None, None, None),  # other key order
        ("fusion", {"vision": 1_000_000, "total": 1_500_000}, 7, True, None),  # 7 and 8 share the bucket 5-8
        ("text", {"text": 1_000, "total": 2_000}, 1, None, None),
    ]
    folded = fold_records(records)
    values = {key: sorted(v.tolist()) for key, v in folded.values_s.items()}
    assert values == {
        CellKey("fusion", "vision", "5-8", "miss"): [0.002],
        CellKey("fusion", "total", "5-8", "miss"): [0.003],
        CellKey("fusion", "vision", "5-8", "hit"): [0.001, 0.004],
        CellKey("fusion", "total", "5-8", "hit"): [0.0015, 0.005],
        CellKey("fusion", "vision"): [0.006],
        CellKey("fusion", "total"): [0.007],
        CellKey("text", "text", "1"): [1e-6],
        CellKey("text", "total", "1"): [2e-6],
    }
    assert folded.num_records == 5 and folded.num_invalid_records == 0
    assert CellKey("fusion", "vision", "5-8", "hit").segments == (("batch_size", "5-8"), ("cache", "hit"))
    assert CellKey("text", "text", "1").segments == (("batch_size", "1"),)
    assert CellKey("fusion", "total").segments == ()


def test_each_cell_counts_its_samples_in_batches() -> None:
    """A sample of a request served in a batch of b counts 1/b; one without a batch size counts 1."""
    records = [
        *[("vision", {"vision": 2_000_000, "total": 3_000_000}, 8, False, None)] * 8,  # one batch of 8
        *[("vision", {"vision": 1_000_000, "total": 2_000_000}, 7, False, None)] * 14,  # two of 7, same bucket
        *[("vision", {"vision": 1_000_000, "total": 2_000_000}, None, None, None)] * 3,  # not recorded
        ("vision", {"vision": 1_000_000, "total": "slow"}, 2, False, None),  # bad: dropped whole
        ("vision", {"vision": 1_000_000}, 1, True, None),
    ]
    folded = fold_records(records)
    assert folded.num_batches[CellKey("vision", "vision", "5-8", "miss")] == pytest.approx(3.0)
    assert folded.num_batches[CellKey("vision", "total", "5-8", "miss")] == pytest.approx(3.0)
    assert folded.num_batches[CellKey("vision", "vision")] == pytest.approx(3.0)
    assert folded.num_batches[CellKey("vision", "vision", "1", "hit")] == pytest.approx(1.0)
    assert CellKey("vision", "total", "2", "miss") not in folded.num_batches  # its record was dropped
    assert set(folded.num_batches) == set(folded.values_s)


def test_malformed_records_are_skipped_and_counted() -> None:
    records = [
        ("text", {"total": 1_000}, None, None, None),
        ("text", {"total": "slow"}, None, None, None),
        ("text", {"total": -5}, None, None, None),
        ("text", {"total": float("nan")}, None, None, None),
        ("text", {"total": 3_000}, None, None, None),
    ]
    folded = fold_records(records)
    assert folded.num_invalid_records == 3
    assert sorted(folded.values_s[CellKey("text", "total")].tolist()) == [1e-6, 3e-6]


@pytest.mark.parametrize(
    ("batch_size", "label"),
    [(1, "1"), (2, "2"), (3, "3-4"), (4, "3-4"), (5, "5-8"), (16, "9-16"), (33, "33-64"), (64, "33-64"), (65, "65+")],
)
def test_batch_size_buckets(batch_size: int, label: str) -> None:
    assert batch_size_bucket(batch_size) == label


def test_record_is_cheap_and_never_raises() -> None:
    monitor = Monitor(clock=ManualClock())
    stage_ns = {"decode": 1, "queue": 2, "vision": 3, "fusion": 4, "respond": 5, "total": 15}
    monitor.record("fusion", {"total": object()})  # type: ignore[dict-item]  # garbage is only seen at fold time
    num_calls = 20_000
    best_us = float("inf")
    for _ in range(7):  # best of seven: the machine is shared, the call itself is what is measured
        started = time.perf_counter_ns()
        for _ in range(num_calls):
            monitor.record("fusion", stage_ns, batch_size=4, cache_hit=True)
        best_us = min(best_us, (time.perf_counter_ns() - started) / num_calls / 1e3)
    assert best_us < 2.0  # the hot-path target; typically ~0.3-0.5 us
    monitor.tick()
    assert monitor.window_quantiles_s("fusion", "total", (0.5,)) == [pytest.approx(15e-9)]
    snapshot = monitor.export_snapshot()
    assert snapshot.num_invalid_records == 1
    assert {s.stage: s.count for s in snapshot.stages}["total"] == 7 * num_calls


def test_the_background_folder_folds_and_stop_drains() -> None:
    monitor = Monitor(MonitorConfig(fold_interval_s=0.01, window_s=1.0, num_sub_windows=2, baseline_s=1.0))
    monitor.start()
    monitor.start()  # idempotent
    try:
        monitor.record("text", {"total": 5_000_000})
        deadline = time.monotonic() + 5.0
        while monitor.window_quantiles_s("text", "total", (0.5,)) != [0.005] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert monitor.window_quantiles_s("text", "total", (0.5,)) == [0.005]
    finally:
        monitor.stop()
    monitor.record("text", {"total": 5_000_000})
    monitor.record("text", {"total": 5_000_000})
    monitor.stop()  # stopping again still folds what is buffered
    assert monitor.export_snapshot().stages[0].count == 3


@pytest.mark.parametrize(
    "changes",
    [
        {"window_s": 0},
        {"window_s": float("inf")},
        {"num_sub_windows": 0},
        {"threshold": 1.5},
        {"consecutive": 0},
        {"min_samples": 2.5},
        {"tail_ratio": 1.0},
        {"tail_quantiles": (0.999, 1.0)},
        {"max_centroids": 5},
        {"ks_alpha": 0.0},
        {"baseline_s": 5.0},  # shorter than one 10 s sub-window
        {"fold_interval_s": 20.0},
    ],
)
def test_invalid_configs_are_refused(changes: dict[str, object]) -> None:
    with pytest.raises(InvalidMonitorConfigError):
        dataclasses.replace(MonitorConfig(), **changes)


def test_default_config_is_consistent() -> None:
    config = MonitorConfig()
    assert config.threshold == 0.02 and config.consecutive == 3
    assert config.sub_window_s == 10.0
    assert config.num_baseline_sub_windows == 60
    # The noise floor documented in the module: 0.039 at 5000 samples a side.
    assert config.ks_noise_floor(5000, 5000) == pytest.approx(0.039, abs=0.001)
    assert config.ks_noise_floor(100_000, 100_000) < 0.01
