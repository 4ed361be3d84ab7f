"""The drift rule: per stage, is the window different from the baseline; per route, for how long.

A period judges each stage of a route with two tests on its digests:

* **KS**: ``D = sup |F_window - F_baseline|`` must exceed ``threshold`` *and*
  the two-sample noise floor at ``ks_alpha`` (so a quiet route cannot alarm
  on sampling noise). Both sides need ``min_samples``. The floor is computed
  from the *independent observations* on each side, not the samples: the
  requests of one batch share its compute time, so a stage measured across
  a batch (compute, queue, total) counts the batches its samples came from
  (``monitoring.sliding_count``); only the stages each request spends on its
  own (``request_stages``: decode, respond) count requests. Counting a
  batch of 8 as 8 observations would put the floor ``sqrt(8)`` too low, and
  a stationary route's D wanders above it.
* **Tail ratio**: for each quantile q of ``tail_quantiles`` with at least
  ``tail_min_exceedances`` samples beyond it on both sides,
  ``Q_window(q) / Q_baseline(q) >= tail_ratio``. KS cannot see a shift of the
  last 0.01 % of requests (D moves by 1e-4); this rule can. Only slowdowns
  count: a faster tail is not an incident, and KS still reports a broad
  change in either direction.

The route's condition for the period is the ``total`` stage's verdict (the
end-to-end latency users see); a route without ``total`` uses "any stage".
``RouteDriftTracker`` turns conditions into a state: ``consecutive`` shifted
periods raise drift, as many calm ones clear it. A period without enough
samples is no evidence either way: it breaks a rising streak but does not
count towards clearing.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

from fastdigest import TDigest

from monitoring.config import MonitorConfig
from monitoring.digest import ks_distance, quantiles_of

TOTAL_STAGE = "total"


class DriftState(str, enum.Enum):
    """Where a route's drift detection stands; the value appears in the JSON view."""

    WAITING_FOR_READY = "waiting_for_ready"
    LEARNING_BASELINE = "learning_baseline"
    STABLE = "stable"
    DRIFTING = "drifting"


@dataclass(frozen=True)
class StageVerdict:
    """One stage's comparison of window and baseline in one period.

    Attributes:
        stage: Stage name.
        ks: KS statistic D (NaN when either side is empty).
        noise_floor: KS critical value at ``ks_alpha`` for the observations on each side.
        num_window: Samples in the window.
        num_baseline: Samples in the baseline.
        observations_window: Independent observations in the window (batches
            for a stage measured across a batch, else ``num_window``).
        observations_baseline: The same in the baseline.
        is_judged: Both sides hold at least ``min_samples``.
        is_ks_shift: Judged and D above both threshold and noise floor.
        tail_ratios: ``{q: Q_window(q) / Q_baseline(q)}`` for the tail
            quantiles with enough samples beyond them.
        is_tail_shift: Some tail ratio reached ``tail_ratio``.
    """

    stage: str
    ks: float
    noise_floor: float
    num_window: int
    num_baseline: int
    observations_window: float
    observations_baseline: float
    is_judged: bool
    is_ks_shift: bool
    tail_ratios: Mapping[float, float]
    is_tail_shift: bool

    @property
    def is_shifted(self) -> bool:
        return self.is_ks_shift or self.is_tail_shift


def judge_stage(stage: str, window: TDigest, baseline: TDigest, config: MonitorConfig,
                observations: tuple[float, float] | None = None) -> StageVerdict:
    """Compare one stage's window with its baseline under ``config``'s rule.

    ``observations``: independent observations ``(window, baseline)`` for the
    noise floor (the batches the samples came from); ``None``: every sample.
    """
    num_window = int(window.n_values)
    num_baseline = int(baseline.n_values)
    obs_window, obs_baseline = (float(num_window), float(num_baseline)) if observations is None else observations
    # Never more observations than samples (a batch share is <= 1), never fewer than one.
    obs_window, obs_baseline = min(max(obs_window, 1.0), num_window), min(max(obs_baseline, 1.0), num_baseline)
    ks = ks_distance(window, baseline)
    noise_floor = config.ks_noise_floor(obs_window, obs_baseline) if num_window and num_baseline else math.inf
    is_judged = num_window >= config.min_samples and num_baseline >= config.min_samples
    is_ks_shift = is_judged and ks > config.threshold and ks > noise_floor
    tail_ratios = tail_ratios_of(window, baseline, config.tail_quantiles, config.tail_min_exceedances)
    is_tail_shift = is_judged and any(r >= config.tail_ratio for r in tail_ratios.values())
    return StageVerdict(
        stage=stage,
        ks=ks,
        noise_floor=noise_floor,
        num_window=num_window,
        num_baseline=num_baseline,
        observations_window=obs_window,
        observations_baseline=obs_baseline,
        is_judged=is_judged,
        is_ks_shift=is_ks_shift,
        tail_ratios=tail_ratios,
        is_tail_shift=is_tail_shift,
    )


def tail_ratios_of(
    window: TDigest, baseline: TDigest, quantiles: tuple[float, ...], min_exceedances: int
) -> dict[float, float]:
    """``Q_window(q) / Q_baseline(q)`` for each q both sides hold ``min_exceedances`` samples beyond."""
    num_window = int(window.n_values)
    num_baseline = int(baseline.n_values)
    usable = [q for q in quantiles if min(num_window, num_baseline) * (1 - q) >= min_exceedances]
    if not usable:
        return {}
    window_q = quantiles_of(window, usable)
    baseline_q = quantiles_of(baseline, usable)
    return {q: w / b for q, w, b in zip(usable, window_q, baseline_q) if b > 0}


def route_baseline_samples(num_baseline: Mapping[str, int]) -> int:
    """Baseline samples that decide whether a route can be judged, from ``{stage: samples}``.

    The same stage ``route_condition`` reads: ``total`` when the route records
    it, else the stage with the most samples (any judged stage judges the route).
    """
    if TOTAL_STAGE in num_baseline:
        return num_baseline[TOTAL_STAGE]
    return max(num_baseline.values(), default=0)


def route_condition(verdicts: Mapping[str, StageVerdict]) -> bool | None:
    """The route's verdict for a period: shifted, calm, or ``None`` (not enough samples)."""
    total = verdicts.get(TOTAL_STAGE)
    if total is not None:
        return total.is_shifted if total.is_judged else None
    judged = [v for v in verdicts.values() if v.is_judged]
    if not judged:
        return None
    return any(v.is_shifted for v in judged)


class RouteDriftTracker:
    """The state machine of one route: consecutive shifted periods raise drift, calm ones clear it.

    Args:
        consecutive: Periods in a row needed to raise and to clear drift.
        now_unix_s: When tracking starts (the first ``since``).
    """

    def __init__(self, consecutive: int, now_unix_s: float) -> None:
        self._consecutive = consecutive
        self.state = DriftState.WAITING_FOR_READY
        self.since_unix_s = now_unix_s
        self.num_shifted_in_row = 0
        self.num_calm_in_row = 0

    def set_state(self, state: DriftState, now_unix_s: float) -> None:
        """Force a state (readiness, re-learning); resets both streaks."""
        if state is not self.state:
            self.state = state
            self.since_unix_s = now_unix_s
        self.num_shifted_in_row = 0
        self.num_calm_in_row = 0

    def observe(self, condition: bool | None, now_unix_s: float) -> bool:
        """Feed one period's condition; returns whether the state changed."""
        if self.state is DriftState.STABLE:
            self.num_shifted_in_row = self.num_shifted_in_row + 1 if condition else 0
            if self.num_shifted_in_row >= self._consecutive:
                self.set_state(DriftState.DRIFTING, now_unix_s)
                return True
        elif self.state is DriftState.DRIFTING:
            if condition is False:
                self.num_calm_in_row += 1
            elif condition is True:
                self.num_calm_in_row = 0
            if self.num_calm_in_row >= self._consecutive:
                self.set_state(DriftState.STABLE, now_unix_s)
                return True
        return False
