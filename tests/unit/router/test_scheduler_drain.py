"""The load an engine reports: the time to drain the running batch and its queue, overruns counted."""

from __future__ import annotations

from router.lanes import Lane, LaneSettings
from router.request import Route
from router.scheduler import Scheduler
from router.service_time import ServiceTimeEstimator

MS = 1_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns


def test_a_batch_running_past_its_estimate_counts_as_long_again_as_it_ran_not_as_done():
    """A stalled batch must not make its engine look idle (server.workers.engine_dispatch compares this)."""
    clock = FakeClock()
    scheduler = Scheduler([Lane(Route.VISION, LaneSettings(max_batch_size=8))], ServiceTimeEstimator(), clock)
    assert scheduler.drain_s() == 0.0
    scheduler.mark_running(100 * MS)
    clock.now_ns = 40 * MS
    assert scheduler.drain_s() == 0.06, "within its estimate: what is left of it"
    clock.now_ns = 1_000 * MS  # ten times its estimate and still running
    assert scheduler.drain_s() == 1.0
    scheduler.mark_running(0)  # it ended
    assert scheduler.drain_s() == 0.0
