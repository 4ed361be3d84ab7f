"""``Monitor``: the one object the server holds for latency digests and drift.

Life of a sample::

    request thread                  folder (background thread, or tick() by hand)
    --------------                  ---------------------------------------------
    record(route, stage_ns, ...)    every fold_interval_s:
      RecordBuffer.append  ---->      drain the buffer -> fold_records -> one array (s) per cell
      (no lock, O(1))                 under the lock: add each array to its cell,
                                      rotate sub-windows when one is over,
                                      every period_s: judge drift per route

A cell is a (route, stage, batch-size bucket, cache outcome); the all-traffic
and segment series are merged from cells when read (``StageDigests``), so a
sample costs one digest insertion however many series it counts in. A record
that carries ``RequestInputs`` is also counted, per (route, stage), in a
latency histogram of each of its input values (``InputHistograms``: fixed
values, fixed bins), which slides with the digests; attribution reads them to
say which inputs filled the named stage's slow tail.

Each route's drift tracker and latest status live in ``RouteDrift``
(``monitoring.route_drift``), which the monitor calls under its lock.

Readers (the Prometheus collector, the JSON views) take the same lock only to
copy out a snapshot. Baselines are learned per route from ``mark_ready()``
on; a route's is frozen, and the route judged, once ``baseline_s`` has passed
*and* its baseline holds ``min_samples`` (of ``total``, the stage the route's
verdict reads). A server idle after it starts keeps learning until traffic
has filled the baseline, rather than freezing an empty one that could never
judge anything; a route first seen later learns its own the same way.
``relearn_baseline()`` learns them all again (after an intended change: a new
model, a new instance type).

Routes and stages are names chosen by the serving code (``text``, ``vision``,
``fusion``; ``decode`` ... ``total``), never by clients: each new name creates
digests, so they must not come from request data.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from prometheus_client import CollectorRegistry

from monitoring.clock import Clock, SystemClock
from monitoring.collector import SUMMARY_QUANTILES, MonitorCollector
from monitoring.config import MonitorConfig
from monitoring.digest import quantiles_of
from monitoring.drift import route_baseline_samples
from monitoring.errors import MonitorStateError
from monitoring.ingest import FoldResult
from monitoring.input_histograms import InputHistograms
from monitoring.inputs import RequestInputs
from monitoring.record_buffer import RecordBuffer
from monitoring.route_drift import RouteDrift
from monitoring.stage_digests import StageDigests
from monitoring.status import BaselinePhase, ExportSnapshot, RouteBaseline, RouteDriftStatus, StageExport
from monitoring.views import digests_document, drift_document

logger = logging.getLogger(__name__)

class Monitor:
    """Per-(route, stage) T-Digests, drift detection with attribution, and their exports.

    Args:
        config: Windows, drift rule and digest sizes (defaults: ``MonitorConfig()``).
        clock: Time source; a ``ManualClock`` makes tests and simulations exact.
    """

    def __init__(self, config: MonitorConfig | None = None, *, clock: Clock | None = None) -> None:
        self._config = config if config is not None else MonitorConfig()
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._records = RecordBuffer(self._config.max_buffered_records)
        self._num_invalid = 0
        self._lock = threading.Lock()
        self._fold_lock = threading.Lock()  # a drain and the add of what it drained: see _with_buffer_added
        self._series: dict[tuple[str, str], StageDigests] = {}  # (route, stage)
        self._inputs: dict[tuple[str, str], InputHistograms] = {}  # (route, stage), once recorded with inputs
        self._stages: dict[str, list[str]] = {}
        self._drift = RouteDrift(self._config, self._clock)
        self._phase = BaselinePhase.NOT_READY
        self._frozen_routes: set[str] = set()  # routes whose baseline is frozen and judged
        self._num_learned_sub_windows = 0
        self._baseline_started_unix_s: float | None = None
        now_s = self._clock.monotonic_s()
        self._sub_window_start_s = now_s
        self._next_period_s = now_s + self._config.period_s
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()

    @property
    def config(self) -> MonitorConfig:
        return self._config

    @property
    def num_dropped_records(self) -> int:
        """Records refused because the buffer was full (the folder fell behind or was not started)."""
        return self._records.num_dropped

    # ------------------------------------------------------------------ hot path

    def record(
        self,
        route: str,
        stage_ns: Mapping[str, int],
        *,
        batch_size: int | None = None,
        cache_hit: bool | None = None,
        inputs: RequestInputs | None = None,
    ) -> None:
        """Record one request's stage times (nanoseconds, from ``time.perf_counter_ns``).

        An O(1) append, no lock, never raises. ``stage_ns`` is kept, not
        copied: do not mutate it afterwards. ``batch_size`` and ``cache_hit``
        are optional; when given they let attribution split a shift by
        batch-size bucket and cache hit/miss. ``inputs`` (what the request
        carried, ``RequestInputs.of``) lets it split the shift by input value.
        """
        self._records.append(route, stage_ns, batch_size, cache_hit, inputs)

    # ------------------------------------------------------------------ folding

    def tick(self) -> bool:
        """Fold buffered records, slide the window, and judge drift if a period is due.

        This is what the background thread runs every ``fold_interval_s``;
        tests and simulations call it after advancing their clock. Returns
        whether a drift period was evaluated.
        """
        with self._with_buffer_added():
            now_s = self._clock.monotonic_s()
            self._rotate_locked(now_s)
            if now_s + 1e-9 < self._next_period_s:
                return False
            num_periods = math.floor((now_s - self._next_period_s) / self._config.period_s + 1e-9) + 1
            self._next_period_s += num_periods * self._config.period_s
            self._evaluate_locked()
            return True

    @contextmanager
    def _with_buffer_added(self) -> Iterator[None]:
        """Fold the buffered records, then hold ``_lock`` with them added.

        The fold runs outside ``_lock``, so readers never wait for one; ``_fold_lock``
        makes the drain and its add one step for the folder thread, ``mark_ready`` and
        ``relearn_baseline``. Without it a relearn between a fold's drain and its add
        would reset first, and records from before it would enter the new baseline
        (and a new route be missing from the drift view until that add).
        """
        with self._fold_lock:
            folded = self._records.drain_and_fold()
            with self._lock:
                self._add_locked(folded)
                yield

    def start(self) -> None:
        """Start the background folder thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop_event.clear()
        self._thread = threading.Thread(target=self._run, name="mmserve-monitor-folder", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the folder thread and fold what is still buffered."""
        self._stop_event.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
        self.tick()

    def _run(self) -> None:
        while not self._stop_event.wait(self._config.fold_interval_s):
            try:
                self.tick()
            except Exception:  # the folder must outlive one bad fold
                logger.exception("latency monitor fold failed; continuing")

    def _add_locked(self, folded: FoldResult) -> None:
        self._num_invalid += folded.num_invalid_records
        for cell, values_s in folded.values_s.items():
            series = self._series.get((cell.route, cell.stage))
            if series is None:
                series = self._new_series_locked(cell.route, cell.stage)
            series.add(cell, values_s, folded.num_batches.get(cell))
        for key, counts in folded.input_counts.items():
            histograms = self._inputs.get(key)
            if histograms is None:
                if key not in self._series:  # a stage whose samples were all invalid: no digests, no split
                    continue
                histograms = self._inputs[key] = InputHistograms(self._config.num_sub_windows)
            histograms.add(counts)

    def _new_series_locked(self, route: str, stage: str) -> StageDigests:
        series = StageDigests(
            max_centroids=self._config.max_centroids,
            segment_max_centroids=self._config.segment_max_centroids,
            num_sub_windows=self._config.num_sub_windows,
        )
        self._series[(route, stage)] = series
        self._stages.setdefault(route, []).append(stage)
        if self._phase is BaselinePhase.NOT_READY:
            self._drift.add_route(route, BaselinePhase.NOT_READY)
        elif route not in self._frozen_routes:  # a new route learns its own baseline, whatever the others do
            self._drift.add_route(route, BaselinePhase.LEARNING)
            self._phase = BaselinePhase.LEARNING
        return series

    def _rotate_locked(self, now_s: float, force: bool = False) -> None:
        sub_window_s = self._config.sub_window_s
        num_steps = math.floor((now_s - self._sub_window_start_s) / sub_window_s + 1e-9)
        if force:
            num_steps = max(num_steps, 1)
        if num_steps <= 0:
            return
        # A forced rotation only re-aligns the sub-windows at ready/relearn time;
        # what it closes was recorded before the baseline started.
        is_learning = self._phase is BaselinePhase.LEARNING and not force
        frozen = self._frozen_routes
        for (route, _), series in self._series.items():
            series.rotate(num_steps, into_baseline=is_learning and route not in frozen)
        for (route, _), histograms in self._inputs.items():
            histograms.rotate(num_steps, into_baseline=is_learning and route not in frozen)
        self._sub_window_start_s = now_s if force else self._sub_window_start_s + num_steps * sub_window_s
        if is_learning:
            self._num_learned_sub_windows += num_steps
            self._freeze_filled_routes_locked()

    def _freeze_filled_routes_locked(self) -> None:
        """Freeze each learning route whose baseline has had ``baseline_s`` and holds ``min_samples``."""
        if self._num_learned_sub_windows < self._config.num_baseline_sub_windows:
            return
        for route in self._stages:
            if route not in self._frozen_routes and self._baseline_samples_locked(route) >= self._config.min_samples:
                self._frozen_routes.add(route)
                self._drift.freeze(route)
        if self._stages and self._frozen_routes.issuperset(self._stages):
            self._phase = BaselinePhase.FROZEN

    def _baseline_samples_locked(self, route: str) -> int:
        return route_baseline_samples(
            {stage: int(self._series[(route, stage)].baseline.n_values) for stage in self._stages[route]}
        )

    # ------------------------------------------------------------------ lifecycle

    def mark_ready(self) -> None:
        """The server is ready: start learning the baseline from now (idempotent)."""
        with self._with_buffer_added():
            if self._phase is not BaselinePhase.NOT_READY:
                return
            self._start_learning_locked()

    def relearn_baseline(self) -> None:
        """Forget the baseline and learn it again from the next ``baseline_s`` of traffic.

        Raises:
            MonitorStateError: the server has not been marked ready yet.
        """
        with self._with_buffer_added():
            if self._phase is BaselinePhase.NOT_READY:
                raise MonitorStateError("the baseline is learned after mark_ready(); nothing to relearn yet")
            for series in self._series.values():
                series.reset_baseline()
            for histograms in self._inputs.values():
                histograms.reset_baseline()
            self._start_learning_locked()

    def _start_learning_locked(self) -> None:
        # Close the sub-window in progress so the baseline starts exactly now.
        self._rotate_locked(self._clock.monotonic_s(), force=True)
        self._frozen_routes.clear()
        self._num_learned_sub_windows = 0
        self._baseline_started_unix_s = self._clock.unix_s()
        self._set_phase_locked(BaselinePhase.LEARNING)

    def _set_phase_locked(self, phase: BaselinePhase) -> None:
        self._phase = phase
        self._drift.set_phase(phase)

    # ------------------------------------------------------------------ drift

    def _evaluate_locked(self) -> None:
        stages = {route: names for route, names in self._stages.items() if route in self._frozen_routes}
        if stages:
            self._drift.judge_period(stages, lambda route, stage: self._series[(route, stage)],
                                     lambda route, stage: self._inputs.get((route, stage)))

    # ------------------------------------------------------------------ reading

    def drift_status(self) -> dict[str, RouteDriftStatus]:
        """Typed drift status per route after the latest period."""
        with self._lock:
            return self._drift.statuses()

    @property
    def baseline_phase(self) -> BaselinePhase:
        return self._phase

    @property
    def num_input_histograms(self) -> int:
        """(route, stage) series counted by input value: bounded by routes x stages, never by the values sent."""
        with self._lock:
            return len(self._inputs)

    def window_quantiles_s(self, route: str, stage: str, qs: tuple[float, ...] = SUMMARY_QUANTILES) -> list[float]:
        """Quantiles (seconds) of one series' sliding window; NaN when unknown or empty."""
        with self._lock:
            series = self._series.get((route, stage))
            if series is None:
                return [math.nan] * len(qs)
            return quantiles_of(series.window(), qs)

    def export_snapshot(self) -> ExportSnapshot:
        """What one Prometheus scrape shows (see ``MonitorCollector``)."""
        with self._lock:
            stages = []
            for route, names in self._stages.items():
                for stage in names:
                    series = self._series[(route, stage)]
                    lifetime = series.lifetime()
                    stages.append(
                        StageExport(
                            route=route,
                            stage=stage,
                            quantiles_s=tuple(quantiles_of(series.window(), SUMMARY_QUANTILES)),
                            count=int(lifetime.n_values),
                            sum_s=0.0 if lifetime.is_empty() else float(lifetime.sum()),
                        )
                    )
            num_invalid = self._num_invalid
            baselines = tuple(self._baselines_locked().values())
        return ExportSnapshot(
            quantiles=SUMMARY_QUANTILES,
            stages=tuple(stages),
            routes=tuple(self.drift_status().values()),
            num_dropped_records=self._records.num_dropped,
            num_invalid_records=num_invalid,
            baselines=baselines,
        )

    def baselines(self) -> dict[str, RouteBaseline]:
        """Each route's baseline progress: frozen or not, samples held and needed."""
        with self._lock:
            return self._baselines_locked()

    def _baselines_locked(self) -> dict[str, RouteBaseline]:
        return {
            route: RouteBaseline(route, route in self._frozen_routes, self._baseline_samples_locked(route),
                                 self._config.min_samples)
            for route in self._stages
        }

    def drift_view(self) -> dict[str, Any]:
        """JSON-ready drift state for ``GET /v1/monitoring/drift``."""
        with self._lock:
            statuses = self._drift.statuses()
            baselines = self._baselines_locked()
            phase = self._phase
            learned_s = self._num_learned_sub_windows * self._config.sub_window_s
            baseline_started = self._baseline_started_unix_s
        return drift_document(
            statuses=statuses,
            baselines=baselines,
            config=self._config,
            phase=phase,
            baseline_started_unix_s=baseline_started,
            learned_s=learned_s,
            now_unix_s=self._clock.unix_s(),
        )

    def digests_view(self) -> dict[str, Any]:
        """JSON-ready window and lifetime digests for ``GET /v1/monitoring/digests``."""
        with self._lock:
            series = [
                (route, stage, self._series[(route, stage)].window(), self._series[(route, stage)].lifetime())
                for route, names in self._stages.items()
                for stage in names
            ]
        return digests_document(series, config=self._config, now_unix_s=self._clock.unix_s())

    def register(self, registry: CollectorRegistry) -> MonitorCollector:
        """Register this monitor's collector on ``registry`` (the app's own, never the global one)."""
        collector = MonitorCollector(self.export_snapshot)
        registry.register(collector)
        return collector
