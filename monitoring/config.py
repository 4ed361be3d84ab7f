"""``MonitorConfig``: every knob of the latency monitor, with its default.

The server maps ``MMSERVE_DRIFT_WINDOW_S``, ``MMSERVE_DRIFT_BASELINE_S``,
``MMSERVE_DRIFT_PERIOD_S``, ``MMSERVE_DRIFT_THRESHOLD``,
``MMSERVE_DRIFT_CONSECUTIVE`` and ``MMSERVE_DRIFT_MIN_SAMPLES`` onto the
fields of the same name; this module reads no environment itself.

Why the defaults are what they are:

* ``window_s = 4 * period_s``. After one period of a shift, a quarter of the
  window holds shifted traffic, so a shift that moves a fifth of requests
  already shows ``D ~ 0.05`` in the first period and can be confirmed in
  ``consecutive`` periods. A window ten times the period would dilute the
  first period's evidence to ``D ~ 0.02`` and detection would lag.
* ``min_samples = 5000`` and ``ks_alpha``. The two-sample KS noise floor is
  ``c(alpha) * sqrt((n + m) / (n * m))``; at 5000 samples each side and
  ``alpha = 1e-3`` that is 0.039, above the 0.02 threshold. So D must clear
  both the threshold and the noise floor, and a quiet route cannot alarm on
  sampling noise. At 100k samples per side the floor falls to 0.009.
* ``max_centroids = 2000``. On 10^6 heavy-tailed samples fastdigest's rank
  error at P99.99 stays near 1e-5, an order below the 1e-4 that makes a
  P99.99 honest; merging cells into sub-windows and sub-windows into a
  window keeps it there (one pass per merge, headroom where digests absorb
  many merges: see ``monitoring.series``).
* ``input_min_share_growth = 0.1`` and ``input_min_z = 3.5``: an input
  value is named when its share of the named stage's slow tail grew by 10
  points and by 3.5 standard errors (34 values are tested each period; see
  ``monitoring.input_attribution``).
* ``request_stages = ("decode", "respond")``: the stages each request
  spends on its own. Every other stage's noise floor counts batches, not
  requests (``monitoring.drift``).
* ``tail_ratio = 1.5`` on P99.9 / P99.99 with at least
  ``tail_min_exceedances`` samples beyond the quantile on both sides: KS is
  blind to a shift of the last 0.01 % (D moves by 1e-4), the ratio is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from monitoring.errors import InvalidMonitorConfigError


@dataclass(frozen=True)
class MonitorConfig:
    """Windows, drift rule and digest sizes of a ``Monitor``.

    Attributes:
        window_s: Length of the sliding window compared with the baseline and
            exported as quantiles.
        num_sub_windows: Sub-window digests the window is merged from; the
            window slides in steps of ``window_s / num_sub_windows``.
        baseline_s: Traffic learned after ``mark_ready()`` (or
            ``relearn_baseline()``) before a route's baseline is frozen as
            the reference; learning goes on past it until the route's
            baseline also holds ``min_samples``.
        period_s: How often drift is evaluated.
        threshold: KS statistic D above which a period counts as shifted.
        consecutive: Shifted periods in a row that raise drift, and calm
            periods in a row that clear it.
        min_samples: Samples required in both window and baseline before a
            period is judged at all; a route's baseline is not frozen before
            it holds them.
        ks_alpha: Significance level of the KS noise floor D must also clear.
        tail_ratio: Window/baseline ratio of a tail quantile that counts as
            a tail shift even when D is small.
        tail_quantiles: Quantiles the tail rule watches.
        tail_min_exceedances: Samples needed beyond a tail quantile, on both
            sides, before the tail rule trusts it.
        max_centroids: Centroids of every window, lifetime and baseline
            digest, and of every cell (a sample's one digest, see
            ``monitoring.stage_digests``).
        segment_max_centroids: Centroids of the per batch-size and per
            cache-hit digests, merged from cells, used only for attribution.
        fold_interval_s: How often the background thread folds the record
            buffer into the digests; also the worst error in assigning a
            sample to its sub-window.
        max_buffered_records: Records the hot-path buffer holds before new
            ones are dropped (and counted) instead of growing memory.
        input_min_share_growth: Growth of an input value's share of the slow
            tail (window minus baseline) needed to name it.
        input_min_z: The same growth in standard errors needed to name it.
        request_stages: Stages whose samples are independent per request;
            the noise floor of any other stage counts the batches its
            samples came from.
    """

    window_s: float = 120.0
    num_sub_windows: int = 12
    baseline_s: float = 600.0
    period_s: float = 30.0
    threshold: float = 0.02
    consecutive: int = 3
    min_samples: int = 5000
    ks_alpha: float = 1e-3
    tail_ratio: float = 1.5
    tail_quantiles: tuple[float, ...] = (0.999, 0.9999)
    tail_min_exceedances: int = 20
    max_centroids: int = 2000
    segment_max_centroids: int = 200
    fold_interval_s: float = 1.0
    max_buffered_records: int = 1_000_000
    input_min_share_growth: float = 0.1
    input_min_z: float = 3.5
    request_stages: tuple[str, ...] = ("decode", "respond")

    def __post_init__(self) -> None:
        positive = {
            "window_s": self.window_s,
            "baseline_s": self.baseline_s,
            "period_s": self.period_s,
            "threshold": self.threshold,
            "fold_interval_s": self.fold_interval_s,
        }
        for name, value in positive.items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise InvalidMonitorConfigError(f"{name} must be a positive finite number, got {value!r}")
        counts = {
            "num_sub_windows": self.num_sub_windows,
            "consecutive": self.consecutive,
            "min_samples": self.min_samples,
            "tail_min_exceedances": self.tail_min_exceedances,
            "max_buffered_records": self.max_buffered_records,
        }
        for name, value in counts.items():
            if not (isinstance(value, int) and value >= 1):
                raise InvalidMonitorConfigError(f"{name} must be an int >= 1, got {value!r}")
        for name, value in (("max_centroids", self.max_centroids),
                            ("segment_max_centroids", self.segment_max_centroids)):
            if not (isinstance(value, int) and value >= 10):
                raise InvalidMonitorConfigError(f"{name} must be an int >= 10, got {value!r}")
        if self.threshold >= 1:
            raise InvalidMonitorConfigError(f"threshold is a KS statistic in (0, 1), got {self.threshold}")
        if not 0 < self.ks_alpha < 1:
            raise InvalidMonitorConfigError(f"ks_alpha must be in (0, 1), got {self.ks_alpha}")
        if not self.tail_ratio > 1:
            raise InvalidMonitorConfigError(f"tail_ratio must be > 1, got {self.tail_ratio}")
        if any(not 0.5 < q < 1 for q in self.tail_quantiles):
            raise InvalidMonitorConfigError(f"tail_quantiles must lie in (0.5, 1), got {self.tail_quantiles}")
        if not 0 < self.input_min_share_growth <= 1:
            raise InvalidMonitorConfigError(
                f"input_min_share_growth is a share in (0, 1], got {self.input_min_share_growth}")
        if not (isinstance(self.input_min_z, (int, float)) and self.input_min_z >= 0):
            raise InvalidMonitorConfigError(f"input_min_z must be >= 0, got {self.input_min_z!r}")
        if self.baseline_s < self.sub_window_s:
            raise InvalidMonitorConfigError(
                f"baseline_s ({self.baseline_s}) is shorter than one sub-window ({self.sub_window_s} s)"
            )
        if self.fold_interval_s > self.sub_window_s:
            raise InvalidMonitorConfigError(
                f"fold_interval_s ({self.fold_interval_s}) exceeds a sub-window ({self.sub_window_s} s)"
            )

    @property
    def sub_window_s(self) -> float:
        """Length of one sub-window: the step by which the window slides."""
        return self.window_s / self.num_sub_windows

    @property
    def num_baseline_sub_windows(self) -> int:
        """Sub-windows that make up the baseline (``baseline_s`` rounded up)."""
        return math.ceil(self.baseline_s / self.sub_window_s - 1e-9)

    def ks_noise_floor(self, num_a: float, num_b: float) -> float:
        """Two-sample KS critical value at ``ks_alpha`` for ``num_a``, ``num_b`` independent observations."""
        c_alpha = math.sqrt(-0.5 * math.log(self.ks_alpha / 2))
        return c_alpha * math.sqrt((num_a + num_b) / (num_a * num_b))
