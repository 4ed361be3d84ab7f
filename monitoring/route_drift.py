"""``RouteDrift``: each route's drift tracker and the status its latest period left.

The ``Monitor`` owns the digests and the lock; this object owns what drift
detection keeps per route on top of them: a ``RouteDriftTracker`` (how many
shifted or calm periods in a row, the state they add up to) and the
``RouteDriftStatus`` the last judgement produced, with its verdicts and
attribution. The monitor calls it under its own lock, so it takes none.

A route's state follows the monitor's baseline phase until the route's own
baseline is frozen (waiting for ready, learning); from then on each period's
judgement moves it between stable and drifting.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

import numpy as np

from monitoring.attribution import Attribution, DigestPair, attribute
from monitoring.clock import Clock
from monitoring.config import MonitorConfig
from monitoring.drift import DriftState, RouteDriftTracker, StageVerdict, judge_stage, route_condition
from monitoring.input_histograms import InputHistograms
from monitoring.stage_digests import StageDigests
from monitoring.status import BaselinePhase, RouteDriftStatus

_PHASE_STATE = {
    BaselinePhase.NOT_READY: DriftState.WAITING_FOR_READY,
    BaselinePhase.LEARNING: DriftState.LEARNING_BASELINE,
    BaselinePhase.FROZEN: DriftState.STABLE,
}

SeriesOf = Callable[[str, str], StageDigests]  # (route, stage) -> its digests
InputsOf = Callable[[str, str], "InputHistograms | None"]  # (route, stage) -> its input histograms, if any


class RouteDrift:
    """Per-route drift trackers and latest statuses; the caller holds the lock that guards them.

    Args:
        config: The drift rule (``consecutive``, thresholds, request stages).
        clock: Wall-clock time for the states' ``since`` and the periods' ``evaluated`` stamps.
    """

    def __init__(self, config: MonitorConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self._trackers: dict[str, RouteDriftTracker] = {}
        self._statuses: dict[str, RouteDriftStatus] = {}

    def add_route(self, route: str, phase: BaselinePhase) -> None:
        """Track ``route`` from now, in the state ``phase`` implies (idempotent)."""
        if route in self._trackers:
            return
        tracker = RouteDriftTracker(self._config.consecutive, self._clock.unix_s())
        tracker.set_state(_PHASE_STATE[phase], self._clock.unix_s())
        self._trackers[route] = tracker

    def set_phase(self, phase: BaselinePhase) -> None:
        """The baseline changed phase: every route takes the state it implies, its last verdicts forgotten."""
        now_unix_s = self._clock.unix_s()
        for route, tracker in self._trackers.items():
            tracker.set_state(_PHASE_STATE[phase], now_unix_s)
            self._statuses[route] = _status_of(route, tracker, None, None, {}, None)

    def freeze(self, route: str) -> None:
        """``route``'s baseline is frozen: it is stable until its periods say otherwise."""
        tracker = self._trackers[route]
        tracker.set_state(DriftState.STABLE, self._clock.unix_s())
        self._statuses[route] = _status_of(route, tracker, None, None, {}, None)

    def judge_period(self, stages: Mapping[str, list[str]], series_of: SeriesOf, inputs_of: InputsOf) -> None:
        """Judge one period: each given route's stages, window against frozen baseline, with attribution."""
        now_unix_s = self._clock.unix_s()
        for route, names in stages.items():
            pairs: dict[str, DigestPair] = {}
            verdicts: dict[str, StageVerdict] = {}
            for stage in names:
                series = series_of(route, stage)
                pairs[stage] = (series.window(), series.baseline)
                observations = None if stage in self._config.request_stages else series.batch_counts()
                verdicts[stage] = judge_stage(stage, *pairs[stage], self._config, observations)
            condition = route_condition(verdicts)
            attribution = attribute(verdicts, pairs, partial(_segment_pairs, series_of, route), self._config,
                                    partial(_input_counts, inputs_of, route))
            tracker = self._trackers[route]
            tracker.observe(condition, now_unix_s)
            self._statuses[route] = _status_of(route, tracker, now_unix_s, condition, verdicts, attribution)

    def statuses(self) -> dict[str, RouteDriftStatus]:
        """Each tracked route's status after its latest period (or phase change)."""
        return {
            route: self._statuses.get(route) or _status_of(route, tracker, None, None, {}, None)
            for route, tracker in self._trackers.items()
        }


def _segment_pairs(series_of: SeriesOf, route: str, stage: str) -> dict[tuple[str, str], DigestPair]:
    return series_of(route, stage).segment_pairs()


def _input_counts(inputs_of: InputsOf, route: str, stage: str) -> tuple[np.ndarray, np.ndarray] | None:
    histograms = inputs_of(route, stage)
    return None if histograms is None else (histograms.window(), histograms.baseline)


def _status_of(
    route: str,
    tracker: RouteDriftTracker,
    evaluated_unix_s: float | None,
    condition: bool | None,
    verdicts: Mapping[str, StageVerdict],
    attribution: Attribution | None,
) -> RouteDriftStatus:
    return RouteDriftStatus(
        route=route,
        state=tracker.state,
        since_unix_s=tracker.since_unix_s,
        evaluated_unix_s=evaluated_unix_s,
        condition=condition,
        num_shifted_in_row=tracker.num_shifted_in_row,
        num_calm_in_row=tracker.num_calm_in_row,
        verdicts=dict(verdicts),
        attribution=attribution,
    )
