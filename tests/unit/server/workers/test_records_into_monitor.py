"""An engine's monitor learns its baseline from the first answered request, even before the engine's own warm-up ends.

With several engines the server is ready once any engine is; the monitor's
engine (engine 0) may still be warming up while engine 1 serves. A record from
an API process is an answered request, so it marks the monitor ready.
"""

from __future__ import annotations

from monitoring import ManualClock, Monitor, MonitorConfig
from monitoring.status import BaselinePhase
from server.workers.engine_monitor import RecordsIntoMonitor


def test_the_first_record_marks_the_monitor_ready_and_is_kept():
    clock = ManualClock()
    monitor = Monitor(MonitorConfig(window_s=40.0, num_sub_windows=4, baseline_s=60.0, period_s=10.0,
                                    min_samples=2, fold_interval_s=1.0), clock=clock)
    records = RecordsIntoMonitor(monitor)
    assert monitor.baseline_phase is BaselinePhase.NOT_READY

    for _ in range(3):
        records.record("vision", {"total": 5_000_000, "vision": 4_000_000}, 1, None, None)
    clock.advance(1.0)
    monitor.tick()

    assert monitor.baseline_phase is BaselinePhase.LEARNING
    monitor.relearn_baseline()  # POST /v1/monitoring/baseline: 409 "not ready" while the phase was NOT_READY
    series = next(s for s in monitor.digests_view()["series"] if s["route"] == "vision" and s["stage"] == "total")
    assert series["lifetime"]["n_values"] == 3
