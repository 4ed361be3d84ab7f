"""The router: the server's one entry point into lanes, batching and compute.

``submit`` picks the lane from what a request carries, gives it a deadline
and an urgency, admits or refuses it (a full lane, or a wait that would miss
the deadline, answers at once with a retry estimate), and awaits the compute
thread's answer. Cancelling the awaiting task (the client went away) cancels
the queued item, which then never reaches the model. ``start``/``drain``
bracket the compute threads' life.

Each executor (``router.executors``: by default one for the text lane, one
for vision and fusion) has its own scheduler, batch runner and compute
thread over the one shared model; the segment cache and the metrics are
shared.

``check_compute`` is the watchdog's probe: a compute thread that died, or
whose batch has run longer than ``hang_timeout_ns``, is a ``ComputeFault``.
The first fault found is kept for good (liveness stays false: the process
needs a restart), and every request still waiting is answered at once with
``ComputeUnavailableError`` rather than left hanging.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cache import Modality, SegmentCache
from models.loading.repository import ModelBundle
from models.served_facts import served_model_facts
from monitoring.serving_metrics import ServingMetrics
from router.errors import ComputeUnavailableError, DeadlineExceededError, QueueFullError, ShuttingDownError
from router.executors import ExecutorPlan, shared_executor, validate
from router.joint_budget import JointTokenBudget
from router.lanes import Lane, LaneSettings, Pending
from router.policy import urgency_ns
from router.request import InferenceRequest, InferenceResult, Route
from router.runner import BatchRunner, Outcome, StageHook
from router.scheduler import Scheduler
from router.segments import ImageContent, SegmentCatalog, SegmentPlan
from router.service_time import ServiceTimeEstimator
from router.tracing import BatchTracer
from router.worker import ComputeWorker

logger = logging.getLogger(__name__)


class ComputeFaultKind(str, enum.Enum):
    DIED = "died"
    HUNG = "hung"


@dataclass(frozen=True)
class ComputeFault:
    """Why the compute thread can no longer serve; ``message`` is for logs and 503 bodies."""

    kind: ComputeFaultKind
    message: str


@dataclass
class Executor:
    """One compute thread with its lanes' scheduler and its batch runner."""

    plan: ExecutorPlan
    scheduler: Scheduler
    runner: BatchRunner
    worker: ComputeWorker


class Router:
    """Lanes, schedulers and compute threads for one model on one device."""

    def __init__(
        self,
        bundle: ModelBundle,
        lane_settings: Mapping[Route, LaneSettings],
        metrics: ServingMetrics | None = None,
        *,
        executors: Sequence[ExecutorPlan] = shared_executor(),
        priority_step_ns: int = 1_000_000_000,
        stage_hook: StageHook | None = None,
        cache: SegmentCache | None = None,
        clock_ns: Callable[[], int] = time.perf_counter_ns,
        hang_timeout_ns: int = 0,
        budget: JointTokenBudget | None = None,
        batch_tracer: BatchTracer | None = None,
    ) -> None:
        """``hang_timeout_ns``: a batch running longer is a hang (0: never). ``budget``: images per request
        and joint tokens (default: the model's, ``JointTokenBudget.for_model``). ``batch_tracer``: records
        each batch for its span (``router.tracing``); ``None`` while tracing is off."""
        validate(tuple(executors))
        self.bundle = bundle
        self.budget = budget if budget is not None else JointTokenBudget.for_model(served_model_facts(bundle))
        self.cache = cache if cache is not None else SegmentCache(0, 0)
        self.segments = SegmentCatalog(self.cache, bundle.fingerprint, bundle.config.preprocess.identity())
        self.lanes = {route: Lane(route, lane_settings[route]) for route in Route}
        warm_up_lock = threading.Lock()  # one executor warms up and measures at a time
        self._batch_tracer = batch_tracer
        # Under ONNX Runtime every executor calls the same sessions: a shape one warmed is warm for all (the
        # image executor then skips the text and fusion shapes the text executor ran). Torch keeps one set
        # per executor (per-stream CUDA graphs, kernels compiled per device context).
        self._shared_warm_shapes: set[tuple] | None = set() if bundle.runtime == "onnxruntime" else None
        self.executors = [self._executor(plan, stage_hook, clock_ns, warm_up_lock) for plan in executors]
        self._executor_of = {route: executor for executor in self.executors for route in executor.plan.routes}
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
                scheduler = self._executor_of[route].scheduler
                metrics.queue_depth.labels(lane=route.value).set_function(
                    lambda lane=lane, scheduler=scheduler: scheduler.depth(lane)
                )
            for modality in Modality:
                metrics.cache_bytes.labels(modality=modality.value).set_function(
                    lambda modality=modality: self.cache.stats().of(modality).size_bytes)
                metrics.cache_entries.labels(modality=modality.value).set_function(
                    lambda modality=modality: self.cache.stats().of(modality).num_entries)

    def _executor(self, plan: ExecutorPlan, stage_hook: StageHook | None,
                  clock_ns: Callable[[], int], warm_up_lock: threading.Lock) -> Executor:
        scheduler = Scheduler([self.lanes[route] for route in plan.routes], ServiceTimeEstimator(), clock_ns)
        runner = BatchRunner(self.bundle, {route: self.lanes[route].settings for route in plan.routes},
                             stage_hook=stage_hook, max_images_per_request=self.budget.max_images_per_request,
                             on_cold_shape=functools.partial(self._on_cold_shape, plan.name),
                             warmed_shapes=self._shared_warm_shapes)
        worker = ComputeWorker(plan, scheduler, runner, warm_up_lock=warm_up_lock,
                               on_batch=functools.partial(self._on_batch, runner), clock_ns=clock_ns,
                               batch_tracer=self._batch_tracer)
        return Executor(plan, scheduler, runner, worker)

    def executor_for(self, route: Route) -> Executor:
        """The executor that runs ``route``'s batches."""
        return self._executor_of[route]

    # -- counters (tests and benchmarks read them) ------------------------------

    @property
    def num_computed_items(self) -> int:
        """Requests that reached the model, over all executors."""
        return sum(executor.worker.num_computed_items for executor in self.executors)

    @property
    def num_images_encoded(self) -> int:
        return sum(executor.runner.num_images_encoded for executor in self.executors)

    @property
    def num_texts_encoded(self) -> int:
        return sum(executor.runner.num_texts_encoded for executor in self.executors)

    def engine_states(self) -> list[dict]:
        """``/v1/models``' ``engines``: this router is the server's one engine (several: ``EngineRouter``)."""
        return [{"engine": 0, "serving": self.is_ready,
                 "wait_ms": {lane: round(wait_s * 1e3, 3) for lane, wait_s in self.estimated_waits_s().items()}}]

    def estimated_waits_s(self) -> dict[str, float]:
        """Per lane, the time its executor needs to drain what is queued: the load several engines are compared
        by (``server.workers.engine_dispatch``)."""
        return {route.value: self._executor_of[route].scheduler.drain_s() for route in Route}

    def total_depth(self) -> int:
        """Requests queued in every lane."""
        return sum(executor.scheduler.total_depth() for executor in self.executors)

    # -- life cycle -----------------------------------------------------------

    def start(self) -> None:
        """Start the compute threads (each warms up before it serves)."""
        for executor in self.executors:
            executor.worker.start()

    @property
    def is_ready(self) -> bool:
        return (all(executor.worker.ready.is_set() for executor in self.executors)
                and self.is_alive and not self._is_draining)

    @property
    def is_alive(self) -> bool:
        """Every compute thread runs (warming up or serving), none dead or hung. Event loop only."""
        return self.check_compute() is None and all(executor.worker.is_alive() for executor in self.executors)

    def _find_fault(self) -> ComputeFault | None:
        for executor in self.executors:
            name, worker = executor.plan.name, executor.worker
            if worker.failure is not None:
                return ComputeFault(ComputeFaultKind.DIED, f"the {name} compute thread died: "
                                                           f"{type(worker.failure).__name__}: {worker.failure}")
            running_ns = worker.running_for_ns()
            if self.hang_timeout_ns > 0 and running_ns > self.hang_timeout_ns:
                return ComputeFault(ComputeFaultKind.HUNG,
                                    f"the {name} compute thread is hung: a batch has run for "
                                    f"{running_ns / 1e9:.1f} s (the limit is {self.hang_timeout_ns / 1e9:.1f} s)")
        return None

    def check_compute(self) -> ComputeFault | None:
        """The first compute thread's fault, if any; kept for good. Event loop only.

        On the first fault every waiting request fails with
        ``ComputeUnavailableError`` (its client gets a 503 now, not a hang):
        the process is going to be restarted, whichever lane's thread failed.
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
        for executor in self.executors:
            executor.scheduler.close()
        if self.fault is None:  # a hung thread would hold the shutdown until the deadline
            for executor in self.executors:
                await asyncio.to_thread(executor.worker.join, max(0.1, deadline - time.monotonic()))
        return self._num_in_flight == 0

    # -- requests -------------------------------------------------------------

    def _pending(self, request: InferenceRequest, lane: Lane, loop: asyncio.AbstractEventLoop) -> Pending:
        now_ns = self._clock_ns()
        deadline_ns = request.deadline_ns
        if deadline_ns is None:
            arrival_ns = now_ns if request.arrival_ns is None else request.arrival_ns
            deadline_ns = arrival_ns + lane.settings.default_timeout_ns
        runner = self._executor_of[lane.route].runner
        bucket = runner.length_bucket(len(request.token_ids)) if request.needs_text else 0
        return Pending(
            request=request,
            enqueued_ns=now_ns,
            future=loop.create_future(),
            loop=loop,
            urgency_ns=urgency_ns(deadline_ns, request.priority, self.priority_step_ns),
            length_bucket=bucket,
            deadline_ns=deadline_ns,
        )

    def _on_cold_shape(self, executor: str, shape: tuple) -> None:
        """A batch met a shape warm-up did not run (compute thread): counted, and said once in the log."""
        logger.warning("the %s executor ran shape %s after ready: warm-up did not cover it", executor, shape)
        if self.metrics is not None:
            self.metrics.cold_compiles_total.labels(kind="shape").inc()

    def plan_segments(self, images: Sequence[ImageContent], token_ids: Sequence[int] | None,
                      use_cache: bool = True) -> SegmentPlan:
        """What the cache already knows of a request, before any of its images is decoded.

        Thread-safe. The caller owns the plan's claims: ``router.intake``
        submits it and settles it whatever happens.
        """
        return self.segments.plan(images, token_ids, use_cache)

    async def submit(self, request: InferenceRequest, plan: SegmentPlan | None = None) -> InferenceResult:
        """Queue ``request`` and await its result; raises the router's typed errors.

        With a ``plan``, the segments this request computes are published to
        the cache (or its claims failed with the model's error) before the
        answer comes back. A plan whose request never reaches the model is
        the caller's to settle; ``router.intake`` does.
        """
        return await self.enqueue(request, plan)  # cancelling this task cancels the future, and the queued item

    def enqueue(self, request: InferenceRequest, plan: SegmentPlan | None = None) -> asyncio.Future[InferenceResult]:
        """``submit`` without a task awaiting it: the future of ``request``'s result, the router's typed
        errors raised at once. Cancelling the future cancels the queued item, as cancelling ``submit``'s
        task does.

        For the engine behind API processes (``router.intake``'s ``start_one``),
        where a task per request, and the coroutines it steps through, cost
        the one process every request passes more than the request's own
        share of its batch.
        """
        pending = self._admit(request, plan)
        self._num_in_flight += 1
        self._waiting.add(pending)
        pending.future.add_done_callback(functools.partial(self._answered, pending))
        return pending.future

    def _answered(self, pending: Pending, _: asyncio.Future) -> None:
        self._num_in_flight -= 1
        self._waiting.discard(pending)

    def _admit(self, request: InferenceRequest, plan: SegmentPlan | None) -> Pending:
        """``request`` queued in its lane, or the router's typed error for why not."""
        if self._is_draining:
            raise ShuttingDownError("the server is shutting down")
        fault = self.check_compute()
        if fault is not None:
            raise ComputeUnavailableError(fault.message)
        lane = self.lanes[request.lane]
        executor = self._executor_of[lane.route]
        if not executor.worker.is_alive():
            raise ComputeUnavailableError(f"the {executor.plan.name} compute thread is not running")
        pending = self._pending(request, lane, asyncio.get_running_loop())
        pending.plan = plan
        if pending.deadline_ns <= pending.enqueued_ns:
            raise DeadlineExceededError("the deadline passed before the request reached the queue")
        refusal = executor.scheduler.admit(lane, pending)
        if refusal is not None:
            if refusal.reason == "deadline_too_short":  # nothing queued is to blame: a retry cannot help, and
                # it is not load shedding (mmserve_rejected_total, which the shedding alert watches): a 504
                raise DeadlineExceededError(
                    f"the deadline leaves {max(0, refusal.left_ns) / 1e6:.1f} ms, less than this request's own "
                    f"estimated compute time on the {lane.route.value} lane ({refusal.service_ns / 1e6:.1f} ms)")
            if self.metrics is not None:
                self.metrics.rejected_total.labels(lane=lane.route.value, reason=refusal.reason).inc()
            raise QueueFullError(lane.route.value, refusal.reason, refusal.retry_after_s)
        return pending

    def _on_batch(self, runner: BatchRunner, lane: Lane, batch: Sequence[Pending],
                  outcomes: Sequence[Outcome]) -> None:
        """Runs on a compute thread right after its batch: cache publication and metrics."""
        for pending, outcome in zip(batch, outcomes, strict=True):
            if pending.plan is None:
                continue
            if isinstance(outcome, Exception):
                pending.plan.fail(outcome)
            else:
                pending.plan.publish(outcome.image_segments, outcome.text_segment, runner.device_work.wait)
        if self.metrics is not None:
            self.metrics.batch_size.labels(lane=lane.route.value).observe(len(batch))
