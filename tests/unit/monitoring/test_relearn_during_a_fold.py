"""A baseline relearned while the folder thread folds waits for that fold: nothing from before it is lost or learned."""

from __future__ import annotations

import threading

import pytest

from monitoring import DriftState, Monitor, MonitorConfig
from monitoring.clock import ManualClock
from monitoring.record_buffer import RecordBuffer


def test_a_relearn_waits_for_the_fold_in_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    config, clock = MonitorConfig(), ManualClock()
    monitor = Monitor(config, clock=clock)
    monitor.mark_ready()
    monitor.record("vision", {"total": 5_000_000})

    drained, release = threading.Event(), threading.Event()
    real_drain = RecordBuffer.drain_and_fold

    def drain_then_pause_in_the_folder(buffer: RecordBuffer):  # noqa: ANN202 - the real method's FoldResult
        folded = real_drain(buffer)
        if threading.current_thread().name == "folder":  # records popped, not yet added: the window at stake
            drained.set()
            release.wait(10)
        return folded

    monkeypatch.setattr(RecordBuffer, "drain_and_fold", drain_then_pause_in_the_folder)
    folder = threading.Thread(target=monitor.tick, name="folder")
    folder.start()
    assert drained.wait(10)
    relearn = threading.Thread(target=monitor.relearn_baseline, name="relearn")
    relearn.start()
    relearn.join(0.3)
    assert relearn.is_alive(), "a relearn must not reset between a fold's drain and its add"
    release.set()
    folder.join(10)
    relearn.join(10)
    assert not relearn.is_alive() and not folder.is_alive()
    # The record from before the relearn was added before it: its route is known at once ...
    assert monitor.drift_status()["vision"].state is DriftState.LEARNING_BASELINE
    clock.advance(config.sub_window_s)
    monitor.tick()  # ... and the first sub-window learned after the relearn does not hold it.
    assert monitor._series[("vision", "total")].baseline.n_values == 0  # noqa: SLF001 - the digest behind the views
