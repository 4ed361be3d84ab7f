"""An admission wakes the sleeping compute thread only when it changes what the thread decided.

The compute thread runs ``Scheduler.next_batch`` in a real thread; the
scheduler's clock is a fake one (the thread's sleeps are long real waits
unless something wakes it), and its condition counts wake-ups and sleeps.
"""

from __future__ import annotations

import threading
import time

from router.lanes import Lane, LaneSettings
from router.request import Route
from router.scheduler import Scheduler
from router.service_time import ServiceTimeEstimator
from tests.unit.router.test_batching_policy import MS, names, pending

LONG_DELAY_MS = 60_000  # a thread that nothing wakes sleeps a minute of real time


class CountingCondition(threading.Condition):
    """A condition that counts ``notify`` calls and sleeps begun."""

    def __init__(self) -> None:
        super().__init__()
        self.num_notified = 0
        self.num_waits = 0

    def notify(self, n: int = 1) -> None:
        self.num_notified += 1
        super().notify(n)

    def wait(self, timeout: float | None = None) -> bool:
        self.num_waits += 1
        return super().wait(timeout)


class ComputeThread:
    """``next_batch`` in a thread of its own, the batch it got, and the number of sleeps to wait for."""

    def __init__(self, scheduler: Scheduler, condition: CountingCondition) -> None:
        self.scheduler = scheduler
        self.condition = condition
        self.batch: list[str] | None = None
        self._thread = threading.Thread(target=self._take, daemon=True)
        self._thread.start()

    def _take(self) -> None:
        decision = self.scheduler.next_batch()
        self.batch = names(decision.batch) if decision is not None else None

    def wait_until_asleep(self, num_waits: int) -> None:
        deadline_s = time.monotonic() + 5
        while time.monotonic() < deadline_s:
            with self.condition:
                if self.condition.num_waits >= num_waits and self.scheduler._is_asleep:
                    return
            time.sleep(0.001)
        raise AssertionError(f"the compute thread did not go to sleep {num_waits} times")

    def join(self) -> list[str] | None:
        self._thread.join(5)
        assert not self._thread.is_alive(), "the compute thread is still waiting"
        return self.batch


def scheduler_with(max_batch_size: int, clock_ns) -> tuple[Scheduler, Lane, CountingCondition]:
    text = Lane(Route.TEXT, LaneSettings(max_batch_size=max_batch_size, max_queue_delay_ns=LONG_DELAY_MS * MS))
    scheduler = Scheduler([text], ServiceTimeEstimator(), clock_ns=clock_ns)
    condition = CountingCondition()
    scheduler._condition = condition
    return scheduler, text, condition


def test_an_idle_thread_is_woken_by_the_first_admission():
    scheduler, text, condition = scheduler_with(max_batch_size=1, clock_ns=lambda: 0)
    thread = ComputeThread(scheduler, condition)
    thread.wait_until_asleep(1)
    assert scheduler.admit(text, pending(0, deadline_ms=10**9, name="a")) is None
    assert thread.join() == ["a"]
    assert condition.num_notified == 1


def test_an_admission_that_cannot_close_a_batch_sooner_lets_the_thread_sleep_and_a_full_batch_wakes_it():
    scheduler, text, condition = scheduler_with(max_batch_size=3, clock_ns=lambda: 0)
    thread = ComputeThread(scheduler, condition)
    thread.wait_until_asleep(1)
    scheduler.admit(text, pending(0, deadline_ms=10**9, name="a"))  # wakes the idle thread: it sleeps till 60 s
    thread.wait_until_asleep(2)
    scheduler.admit(text, pending(0, deadline_ms=10**9, name="b"))  # closes no sooner: no wake-up
    time.sleep(0.05)
    assert condition.num_notified == 1 and condition.num_waits == 2 and thread.batch is None
    scheduler.admit(text, pending(0, deadline_ms=10**9, name="c"))  # fills the batch
    assert thread.join() == ["a", "b", "c"]
    assert condition.num_notified == 2


def test_an_admission_whose_deadline_closes_its_batch_sooner_wakes_the_thread():
    now_ns = [0]
    scheduler, text, condition = scheduler_with(max_batch_size=8, clock_ns=lambda: now_ns[0])
    for size in (1, 8):
        scheduler.estimator.observe(Route.TEXT, size, 50 * MS)  # every batch takes 50 ms
    thread = ComputeThread(scheduler, condition)
    thread.wait_until_asleep(1)
    scheduler.admit(text, pending(0, deadline_ms=10**9, name="a"))
    thread.wait_until_asleep(2)  # until 60 s of the fake clock: a's queue delay
    now_ns[0] = 500 * MS
    scheduler.admit(text, pending(500, deadline_ms=600, name="urgent"))  # its batch must start by 550 ms
    thread.wait_until_asleep(3)  # woken, it sleeps again, now only until 550 ms
    assert condition.num_notified == 2 and thread.batch is None
    now_ns[0] = 560 * MS
    assert thread.join() == ["urgent", "a"]


def test_an_admission_with_a_shorter_queue_delay_wakes_the_thread():
    """The queue delay counts from each request's own enqueue time, not from the thread's decision."""
    now_ns = [0]
    scheduler, text, condition = scheduler_with(max_batch_size=8, clock_ns=lambda: now_ns[0])
    thread = ComputeThread(scheduler, condition)
    thread.wait_until_asleep(1)
    now_ns[0] = 10 * MS
    scheduler.admit(text, pending(10, deadline_ms=10**9, name="late"))
    thread.wait_until_asleep(2)
    scheduler.admit(text, pending(0, deadline_ms=10**9, name="early"))  # enqueued earlier: closes sooner
    thread.wait_until_asleep(3)
    assert condition.num_notified == 2
    now_ns[0] = (LONG_DELAY_MS + 1) * MS
    scheduler.close()
    assert sorted(thread.join() or []) == ["early", "late"]
    assert scheduler.next_batch() is None


def test_the_slowest_measured_batch_bounds_the_estimate_of_every_warmed_size():
    """What admission compares a deadline against: no warmed shape's estimate exceeds it."""
    estimator = ServiceTimeEstimator(smoothing=1.0)
    assert estimator.slowest_ns(Route.TEXT) == 0
    settings = LaneSettings(max_batch_size=8)
    for size, elapsed_ms in ((1, 30), (4, 20), (8, 50)):  # warm-up measures smallest, middle, largest
        estimator.observe(Route.TEXT, size, elapsed_ms * MS)
    assert estimator.slowest_ns(Route.TEXT) == 50 * MS
    assert max(estimator.estimate_ns(Route.TEXT, size) for size in settings.warm_batch_sizes) <= 50 * MS
    estimator.observe(Route.TEXT, 8, 10 * MS)  # the largest got faster: the bound follows
    assert estimator.slowest_ns(Route.TEXT) == 30 * MS
