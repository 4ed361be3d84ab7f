"""A compute thread: runs the batches of its executor's lanes through the model.

It warms its lanes' shapes up and measures their service times first (one
executor at a time, under a lock the executors share, so no measurement is
taken while another thread computes), then loops: take
the next closed batch from the scheduler, answer requests that expired in the
queue with 504 (they never reach the model), skip those whose client went
away, run the rest, and hand the outcomes back to the event loop awaiting them
with one ``loop.call_soon_threadsafe`` per batch.

The thread stamps the start of every batch and clears the stamp when the
batch is done (``running_for_ns``): a stamp that grows old is a hang, which
the router tells from a slow batch by its hang timeout. A thread that dies
keeps its exception in ``failure``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence

from router.errors import DeadlineExceededError
from router.executors import ExecutorPlan, lower_current_thread_priority
from router.lanes import Lane, Pending
from router.policy import num_work_items
from router.runner import BatchRunner, Outcome
from router.scheduler import Scheduler
from router.tracing import BatchTracer

logger = logging.getLogger(__name__)


def _resolve(future: asyncio.Future, outcome: Outcome) -> None:
    """Runs on the event loop: settle the future unless its awaiter gave up."""
    if future.done():
        return
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _resolve_all(settled: list[tuple[asyncio.Future, Outcome]]) -> None:
    """Runs on the event loop: settle every future of one batch (``_resolve`` each)."""
    for future, outcome in settled:
        _resolve(future, outcome)


def settle(pending: Pending, outcome: Outcome) -> None:
    """Hand ``outcome`` to the loop awaiting ``pending``; safe from any thread."""
    settle_all([(pending, outcome)])


def settle_all(outcomes: Sequence[tuple[Pending, Outcome]]) -> None:
    """Hand each outcome to the loop awaiting its ``Pending``, one wake-up per loop; safe from any thread.

    A batch of 16 answered with one ``call_soon_threadsafe`` wakes the event
    loop once instead of 16 times.
    """
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Outcome]]] = {}
    for pending, outcome in outcomes:
        by_loop.setdefault(pending.loop, []).append((pending.future, outcome))
    for loop, settled in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve_all, settled)
        except RuntimeError:
            logger.debug("dropped %d outcomes: their event loop is closed", len(settled))


class ComputeWorker:
    """One executor's thread; ``ready`` is set once every shape of its lanes has run."""

    def __init__(
        self,
        plan: ExecutorPlan,
        scheduler: Scheduler,
        runner: BatchRunner,
        *,
        warm_up_lock: threading.Lock | None = None,
        on_batch: Callable[[Lane, list[Pending], list[Outcome]], None] | None = None,
        clock_ns: Callable[[], int] = time.perf_counter_ns,
        batch_tracer: BatchTracer | None = None,
    ) -> None:
        self.plan = plan
        self.scheduler = scheduler
        self.runner = runner
        self.ready = threading.Event()
        self.stopped = threading.Event()
        self.failure: BaseException | None = None
        self.num_computed_items = 0  # requests that reached the model (tests count on it)
        self._batch_started_ns: int | None = None  # set while a batch runs: the hang heartbeat
        self._on_batch = on_batch
        self._clock_ns = clock_ns
        self._batch_tracer = batch_tracer  # None while tracing is off: no per-batch work at all
        self._warm_up_lock = warm_up_lock if warm_up_lock is not None else threading.Lock()
        self._thread = threading.Thread(target=self._main, name=f"mmserve-{plan.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def running_for_ns(self) -> int:
        """How long the batch on the model has been running; 0 when the thread waits for work."""
        started_ns = self._batch_started_ns
        return 0 if started_ns is None else max(0, self._clock_ns() - started_ns)

    def _main(self) -> None:
        try:
            # Before the first torch call: the OpenMP workers it starts inherit the priority.
            lower_current_thread_priority(self.plan.nice)
            self.runner.limit_compute_threads()
            with self.runner.device_work.stream(self.plan.high_priority_stream):
                self._warm_up()
                self.ready.set()
                self._serve()
        except BaseException as e:  # noqa: BLE001 - recorded so health checks can report it
            self.failure = e
            logger.exception("the %s compute thread died", self.plan.name)
            raise
        finally:
            self.stopped.set()

    def _warm_up(self) -> None:
        with self._warm_up_lock:
            started = time.perf_counter()
            num_shapes = self.runner.warm_up()
            self.runner.measure_service_times(self.scheduler.estimator.observe)
            self.runner.mark_ready()
            logger.info("%s executor: warm-up ran %d shapes in %.1f s",
                        self.plan.name, num_shapes, time.perf_counter() - started)

    def _serve(self) -> None:
        while (scheduled := self.scheduler.next_batch()) is not None:
            now_ns = self._clock_ns()
            settle_all([(pending, DeadlineExceededError(
                f"deadline passed after {(now_ns - pending.enqueued_ns) / 1e6:.1f} ms in the queue"))
                for pending in scheduled.expired])
            if scheduled.lane is not None:
                self._run(scheduled.lane, scheduled.batch)

    def _run(self, lane: Lane, batch: list[Pending]) -> None:
        runnable = [p for p in batch if not p.is_cancelled]
        if not runnable:
            return
        estimator = self.scheduler.estimator
        # Image work counts per image: a batch of 2 requests with 3 new images each runs as 6.
        num_items = min(num_work_items(runnable), lane.settings.max_batch_size)
        padded = lane.settings.padded_size(num_items)
        self.scheduler.mark_running(estimator.estimate_ns(lane.route, padded))
        started_ns = self._clock_ns()
        self.num_computed_items += len(runnable)
        self._batch_started_ns = started_ns
        outcomes = self.runner.run(lane.route, [p.request for p in runnable])
        elapsed_ns = self._clock_ns() - started_ns
        self.scheduler.mark_running(0)
        if not any(isinstance(o, Exception) for o in outcomes):
            estimator.observe(lane.route, padded, elapsed_ns)
        if self._batch_tracer is not None:
            outcomes = self._with_batch_trace(lane, runnable, outcomes, num_items, padded, started_ns, elapsed_ns)
        # Publish to the cache before answering: a client's next request may
        # follow its answer at once, and must find what this batch computed.
        if self._on_batch is not None:
            self._on_batch(lane, runnable, outcomes)
        for pending, outcome in zip(runnable, outcomes, strict=True):
            if not isinstance(outcome, Exception):
                outcome.stage_ns["queue"] = started_ns - pending.enqueued_ns
        settle_all(list(zip(runnable, outcomes)))
        self._batch_started_ns = None

    def _with_batch_trace(self, lane: Lane, runnable: list[Pending], outcomes: list[Outcome], num_items: int,
                          padded: int, started_ns: int, elapsed_ns: int) -> list[Outcome]:
        """Each answer carries the record of the batch that computed it (router.tracing)."""
        assert self._batch_tracer is not None
        requests = [p.request for p in runnable]
        results = [o for o in outcomes if not isinstance(o, Exception)]
        longest = max((len(p.request.token_ids) for p in runnable if p.request.needs_text), default=0)
        trace = self._batch_tracer.record(
            lane.route, lane.settings, self.plan.name, requests, [r.stage_ns for r in results],
            num_work_items=num_items, padded_size=padded,
            text_width=self.runner.text_width(longest) if longest else 0,
            batch_rows=lambda encoder, num_items: self.runner.batch_rows(encoder, num_items, lane.settings),
            started_ns=started_ns, elapsed_ns=elapsed_ns, num_failed=len(outcomes) - len(results))
        return [o if isinstance(o, Exception) else dataclasses.replace(o, batch_trace=trace) for o in outcomes]
