"""Thread-safe lanes around the batching policy: admission, and ``next_batch`` for the compute thread.

Admission happens on the event loop: a full lane, or an estimated wait that
would already miss the request's deadline, refuses at once with a retry
estimate (the time to drain what is queued). A deadline that the request's
own estimated service time alone misses (nothing queued ahead could be
blamed) is refused apart, as ``deadline_too_short``: retrying cannot help,
so the server answers it as a passed deadline, not as load. The compute
thread blocks in ``next_batch`` until the policy closes a batch.

An admission wakes the compute thread only when it can change what the
thread decided when it went to sleep: the thread sleeps with no timeout
(nothing queued), the admission fills its lane's batch, or the new request's
own batch must close before the thread's timeout would wake it anyway:

    thread asleep until T (the earliest close of a queued batch)
    admit p into lane L:  L full                                       -> wake
                          min(p.enqueued + max_queue_delay,
                              p.deadline - L's slowest batch) < T      -> wake
                          otherwise                                    -> no wake: at T the thread decides
                                                                          with p in the queue

Waking the thread for every admission costs a futex wake and a GIL hand-off
per request, and the thread would only decide to sleep again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.lanes import Lane, Pending
from router.policy import Decision, decide, work_ahead_ns
from router.request import Route
from router.service_time import ServiceTimeEstimator

_NO_LIMIT = 2**62


@dataclass(frozen=True)
class Refusal:
    """Why admission said no, and when trying again makes sense.

    ``deadline_too_short``: the request's own service time (``service_ns``)
    is longer than what is left of its deadline (``left_ns``), with nothing
    ahead of it; ``deadline``: the work queued ahead makes it miss.
    """

    reason: str  # "queue_full" | "deadline" | "deadline_too_short"
    retry_after_s: float
    service_ns: int = 0
    left_ns: int = 0


class Scheduler:
    def __init__(self, lanes: Sequence[Lane], estimator: ServiceTimeEstimator,
                 clock_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        self.lanes = list(lanes)
        self.estimator = estimator
        self._clock_ns = clock_ns
        self._condition = threading.Condition()
        self._is_closed = False
        self._running_until_ns = 0  # expected end of the batch on the device
        self._running_since_ns: int | None = None  # when the running batch started (None: none runs)
        self._last_route: Route | None = None  # the lane of the batch handed out last
        # While the compute thread sleeps in next_batch: when its timeout wakes it (None: only a put does).
        self._is_asleep = False
        self._asleep_until_ns: int | None = None

    def drain_s(self) -> float:
        """The time to finish the running batch and everything queued, at the measured pace."""
        with self._condition:
            return self._drain_s()

    def _drain_s(self) -> float:
        """A batch that runs past its estimate is counted as running as long again as it has run so far (its
        estimate is wrong, and a stalled or hung batch must not look like an idle engine to whoever compares
        loads: ``server.workers.engine_dispatch``); the queue behind it at the measured pace."""
        now_ns = self._clock_ns()
        remaining_ns = self._running_until_ns - now_ns
        if remaining_ns <= 0 and self._running_since_ns is not None:
            remaining_ns = now_ns - self._running_since_ns
        return (max(0, remaining_ns) + work_ahead_ns(self.lanes, _NO_LIMIT, self.estimator.estimate_ns)) / 1e9

    def admit(self, lane: Lane, pending: Pending) -> Refusal | None:
        """Enqueue ``pending`` or say why not (``None`` means admitted)."""
        with self._condition:
            if len(lane.queue) >= lane.settings.max_queue_size:
                return Refusal("queue_full", self._drain_s())
            now_ns = self._clock_ns()
            service_ns = self.estimator.estimate_ns(lane.route, lane.settings.padded_size(
                min(pending.num_work_items, lane.settings.max_batch_size)))
            if now_ns + service_ns > pending.deadline_ns:
                return Refusal("deadline_too_short", 0.0, service_ns, pending.deadline_ns - now_ns)
            wait_ns = (
                max(0, self._running_until_ns - now_ns)
                + work_ahead_ns(self.lanes, pending.urgency_ns, self.estimator.estimate_ns)
                + service_ns
            )
            if now_ns + wait_ns > pending.deadline_ns:
                return Refusal("deadline", self._drain_s())
            lane.queue.append(pending)
            if self._is_asleep and self._changes_decision(lane, pending):
                self._condition.notify()
            return None

    def _changes_decision(self, lane: Lane, pending: Pending) -> bool:
        """Whether the sleeping compute thread must decide again now that ``pending`` is queued (lock held)."""
        if self._asleep_until_ns is None:
            return True
        settings = lane.settings
        if lane.queue.work_items >= settings.max_batch_size:
            return True
        if pending.enqueued_ns + settings.max_queue_delay_ns < self._asleep_until_ns:
            return True
        # The earliest its deadline could close its batch: under the slowest batch measured, or the largest
        # size's estimate where warm-up left it untimed (extrapolated: router.shape_free_warm_up).
        service_ns = max(self.estimator.slowest_ns(lane.route),
                         self.estimator.estimate_ns(lane.route, settings.max_batch_size))
        return pending.deadline_ns - service_ns < self._asleep_until_ns

    def depth(self, lane: Lane) -> int:
        with self._condition:
            return len(lane.queue)

    def total_depth(self) -> int:
        with self._condition:
            return sum(len(lane.queue) for lane in self.lanes)

    def close(self) -> None:
        """Wake the compute thread for good; queued items still run (drain)."""
        with self._condition:
            self._is_closed = True
            self._condition.notify_all()

    def mark_running(self, expected_ns: int) -> None:
        """A batch starts, expected to take ``expected_ns`` (0: the batch ended)."""
        with self._condition:
            now_ns = self._clock_ns()
            self._running_until_ns = now_ns + expected_ns
            self._running_since_ns = now_ns if expected_ns > 0 else None

    def next_batch(self) -> Decision | None:
        """Block until a batch closes; ``None`` once closed and empty.

        Requests that expired while queued come back in ``expired`` (possibly
        with an empty batch) so they are answered without waiting for work.
        Once closed (draining), every queued lane counts as closed: the
        policy still picks the order and the batches, it only stops waiting.
        """
        with self._condition:
            while True:
                decision = decide(self.lanes, self._clock_ns(), self.estimator.estimate_ns, self._last_route,
                                  is_draining=self._is_closed)
                if decision.lane is not None or decision.expired:
                    if decision.lane is not None:
                        self._last_route = decision.lane.route
                    return decision
                if self._is_closed:
                    return None  # nothing queued: a closed scheduler with work always decides to run it
                timeout_s = None if decision.wait_ns is None else decision.wait_ns / 1e9
                self._asleep_until_ns = None if decision.wait_ns is None else self._clock_ns() + decision.wait_ns
                self._is_asleep = True
                try:
                    self._condition.wait(timeout=timeout_s)
                finally:
                    self._is_asleep = False
