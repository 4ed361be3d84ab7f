"""The router: the server's one entry point into lanes, batching and compute.

``submit`` picks the lane from what a request carries, gives it a deadline
and an urgency, admits or refuses it (a full lane, or a wait that would miss
the deadline, answers at once with a retry estimate), and awaits the compute
thread's answer. Cancelling the awaiting task (the client went away) cancels
the queued item, which then never reaches the model. ``start``/``drain``
bracket the compute thread's life.

``check_compute`` is the watchdog's probe: a compute thread that died, or
whose batch has run longer than ``hang_timeout_ns``, is a ``ComputeFault``.
The first fault found is kept for good (liveness stays false: the process
needs a restart), and every request still waiting is answered at once with
``ComputeUnavailableError`` rather than left hanging.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cache import Modality, SegmentCache
from models.repository import ModelBundle
from monitoring.serving_metrics import ServingMetrics
from router.errors import ComputeUnavailableError, DeadlineExceededError, QueueFullError, ShuttingDownError
from router.lanes import Lane, LaneSettings, Pending
from router.policy import urgency_ns
from router.request import InferenceRequest, InferenceResult, Route
from router.runner import BatchRunner, Outcome
from router.scheduler import Scheduler
from router.segments import ImageContent, SegmentCatalog, SegmentPlan
from router.service_time import ServiceTimeEstimator
from router.worker import ComputeWorker


class ComputeFaultKind(str, enum.Enum):
    DIED = "died"
    HUNG = "hung"


@dataclass(frozen=True)
class ComputeFault:
    """Why the compute thread can no longer serve; ``message`` is for logs and 503 bodies."""

    kind: ComputeFaultKind
    message: str


class Router:
    """Lanes + scheduler + compute thread for one model on one device."""

    def __init__(
        self,
        bundle: ModelBundle,
        lane_settings: Mapping[Route, LaneSettings],
        metrics: ServingMetrics | None = None,
        *,
        priority_step_ns: int = 1_000_000_000,
        stage_hook: Callable[[str], None] | None = None,
        cache: SegmentCache | None = None,
        clock_ns: Callable[[], int] = time.perf_counter_ns,
        hang_timeout_ns: int = 0,
    ) -> None:
        """``hang_timeout_ns``: a batch running longer is a hang (0: never)."""
        self.bundle = bundle
        self.cache = cache if cache is not None else SegmentCache(0, 0)
        self.segments = SegmentCatalog(self.cache, bundle.fingerprint, bundle.config.preprocess.identity())
        self.lanes = {route: Lane(route, lane_settings[route]) for route in Route}
        self.estimator = ServiceTimeEstimator()
        self.scheduler = Scheduler(list(self.lanes.values()), self.estimator, clock_ns)
        self.runner = BatchRunner(bundle, dict(lane_settings), stage_hook=stage_hook)
        self.worker = ComputeWorker(self.scheduler, self.runner, on_batch=self._on_batch, clock_ns=clock_ns)
        self.metrics = metrics
        self.priority_step_ns = priority_step_ns
        self._clock_ns = clock_ns
        self._is_draining = False
        self._num_in_flight = 0
        self.hang_timeout_ns = hang_timeout_ns
        self.fault: ComputeFault | None = None
        self._waiting: set[Pending] = set()  # admitted, not yet answered (event loop only)
        if metrics is not None:
            for route, lane in self.lanes.items():
                metrics.queue_depth.labels(lane=route.value).set_function(
                    lambda lane=lane: self.scheduler.depth(lane)
                )
            for modality in Modality:
                metrics.cache_bytes.labels(modality=modality.value).set_function(
                    lambda modality=modality: self.cache.stats().of(modality).size_bytes)
                metrics.cache_entries.labels(modality=modality.value).set_function(
                    lambda modality=modality: self.cache.stats().of(modality).num_entries)

    # -- life cycle -----------------------------------------------------------

    def start(self) -> None:
        """Start the compute thread (it warms up before it serves)."""
        self.worker.start()

    @property
    def is_ready(self) -> bool:
        return self.worker.ready.is_set() and self.is_alive and not self._is_draining

    @property
    def is_alive(self) -> bool:
        """The compute thread runs (warming up or serving), neither dead nor hung. Event loop only."""
        return self.check_compute() is None and self.worker.is_alive()

    def _find_fault(self) -> ComputeFault | None:
        failure = self.worker.failure
        if failure is not None:
            return ComputeFault(ComputeFaultKind.DIED,
                                f"the compute thread died: {type(failure).__name__}: {failure}")
        running_ns = self.worker.running_for_ns()
        if self.hang_timeout_ns > 0 and running_ns > self.hang_timeout_ns:
            return ComputeFault(ComputeFaultKind.HUNG,
                                f"the compute thread is hung: a batch has run for {running_ns / 1e9:.1f} s "
                                f"(the limit is {self.hang_timeout_ns / 1e9:.1f} s)")
        return None

    def check_compute(self) -> ComputeFault | None:
        """The compute thread's fault, if any; the first one found is kept. Event loop only.

        On the first fault every waiting request fails with
        ``ComputeUnavailableError`` (its client gets a 503 now, not a hang).
        """
        if self.fault is None:
            self.fault = self._find_fault()
            if self.fault is not None:
                error = ComputeUnavailableError(self.fault.message)
                for pending in list(self._waiting):
                    if not pending.future.done():
                        pending.future.set_exception(error)
        return self.fault

    @property
    def is_draining(self) -> bool:
        return self._is_draining

    @property
    def num_in_flight(self) -> int:
        return self._num_in_flight

    def begin_drain(self) -> None:
        """Readiness goes false and new requests are refused from now on."""
        self._is_draining = True

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new work, finish what was accepted; ``True`` if all finished in time."""
        self.begin_drain()
        deadline = time.monotonic() + timeout_s
        while self._num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.scheduler.close()
        if self.fault is None:  # a hung thread would hold the shutdown until the deadline
            await asyncio.to_thread(self.worker.join, max(0.1, deadline - time.monotonic()))
        return self._num_in_flight == 0

    # -- requests -------------------------------------------------------------

    def _pending(self, request: InferenceRequest, lane: Lane, loop: asyncio.AbstractEventLoop) -> Pending:
        now_ns = self._clock_ns()
        if request.deadline_ns is None:
            arrival_ns = now_ns if request.arrival_ns is None else request.arrival_ns
            request = dataclasses.replace(request, deadline_ns=arrival_ns + lane.settings.default_timeout_ns)
        bucket = self.runner.length_bucket(len(request.token_ids)) if request.needs_text else 0
        return Pending(
            request=request,
            enqueued_ns=now_ns,
            future=loop.create_future(),
            loop=loop,
            urgency_ns=urgency_ns(request.deadline_ns, request.priority, self.priority_step_ns),
            length_bucket=bucket,
        )

    def plan_segments(self, image: ImageContent | None, token_ids: Sequence[int] | None,
                      use_cache: bool = True) -> SegmentPlan:
        """What the cache already knows of a request, before its image is decoded.

        Thread-safe. The caller must pass the plan to ``submit``, or call
        ``plan.abandon()`` if the request ends before that.
        """
        return self.segments.plan(image, token_ids, use_cache)

    async def submit(self, request: InferenceRequest, plan: SegmentPlan | None = None) -> InferenceResult:
        """Queue ``request`` and await its result; raises the router's typed errors.

        With a ``plan``, segments it found are used instead of computing them
        and segments this request computes are published to the cache.
        """
        try:
            if self._is_draining:
                raise ShuttingDownError("the server is shutting down")
            fault = self.check_compute()
            if fault is not None:
                raise ComputeUnavailableError(fault.message)
            if not self.worker.is_alive():
                raise ComputeUnavailableError("the compute thread is not running")
            lane = self.lanes[request.lane]
            pending = self._pending(request, lane, asyncio.get_running_loop())
            pending.plan = plan
            if pending.request.deadline_ns <= pending.enqueued_ns:
                raise DeadlineExceededError("the deadline passed before the request reached the queue")
            refusal = self.scheduler.admit(lane, pending)
            if refusal is not None:
                if self.metrics is not None:
                    self.metrics.rejected_total.labels(lane=lane.route.value, reason=refusal.reason).inc()
                raise QueueFullError(lane.route.value, refusal.reason, refusal.retry_after_s)
            self._num_in_flight += 1
            self._waiting.add(pending)
            try:
                return await pending.future
            finally:
                self._num_in_flight -= 1
                self._waiting.discard(pending)
        except BaseException:
            if plan is not None:
                plan.abandon()  # a no-op for claims already published or failed
            raise

    def _on_batch(self, lane: Lane, batch: Sequence[Pending], outcomes: Sequence[Outcome]) -> None:
        """Runs on the compute thread right after a batch: cache publication and metrics."""
        for pending, outcome in zip(batch, outcomes, strict=True):
            if pending.plan is None:
                continue
            if isinstance(outcome, Exception):
                pending.plan.fail(outcome)
            else:
                pending.plan.publish(outcome.image_segment, outcome.text_segment)
        if self.metrics is not None:
            self.metrics.batch_size.labels(lane=lane.route.value).observe(len(batch))
