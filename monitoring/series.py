"""The digests kept for one latency series: sliding window, lifetime, baseline.

A series is one (route, stage) pair, or one segment of it (a batch-size
bucket or cache hit/miss) kept only for attribution::

    time ->   ... | sw[-3] | sw[-2] | sw[-1] | current |
                  '------- closed (<= N-1) -------'
    window   = merge(closed) + current                 (between N-1 and N sub-windows long)
    lifetime = lifetime_closed + current               (every closed sub-window merged once)
    baseline = closed sub-windows of the learning interval, then frozen

Values are folded into ``current`` only (one Rust ``batch_update`` per fold);
lifetime and baseline grow by merging a sub-window when it closes, so the
per-sample cost does not triple. Rotation is driven from outside, in lockstep
for every series, by the ``Monitor`` that owns the clock.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np
from fastdigest import TDigest

from monitoring.digest import merge_all, new_digest

ALL_TRAFFIC = ""
"""``SeriesKey.dimension`` of a series that holds every request of its (route, stage)."""


class SeriesKey(NamedTuple):
    """Identity of a series; ``dimension``/``value`` name a segment (e.g. ``"cache"``/``"miss"``)."""

    route: str
    stage: str
    dimension: str = ALL_TRAFFIC
    value: str = ""


class SeriesDigests:
    """Sub-window ring, lifetime and baseline digests of one series.

    Not thread-safe: the ``Monitor`` serialises every call under its lock.

    Args:
        max_centroids: Centroids per digest.
        num_sub_windows: Sub-windows in the window, the current one included.
        keep_lifetime: Whether to keep a lifetime digest (segments do not).
    """

    __slots__ = ("_max_centroids", "_current", "_closed", "_lifetime_closed", "_baseline", "_window_cache")

    def __init__(self, max_centroids: int, num_sub_windows: int, keep_lifetime: bool) -> None:
        self._max_centroids = max_centroids
        self._current = new_digest(max_centroids)
        self._closed: deque[TDigest] = deque(maxlen=max(num_sub_windows - 1, 0))
        self._lifetime_closed: TDigest | None = new_digest(max_centroids) if keep_lifetime else None
        self._baseline = new_digest(max_centroids)
        self._window_cache: TDigest | None = None

    def add(self, values_s: np.ndarray) -> None:
        """Fold latencies (seconds, float64) into the current sub-window."""
        if values_s.size:
            self._current.batch_update(values_s)
            self._window_cache = None

    def rotate(self, num_steps: int, into_baseline: bool) -> None:
        """Close the current sub-window and slide the window by ``num_steps`` sub-windows.

        The closed sub-window joins the lifetime digest, and the baseline when
        ``into_baseline`` (the baseline is being learned). Steps beyond the first are sub-windows in
        which nothing was folded (the monitor was idle); they enter the ring
        empty.
        """
        if num_steps <= 0:
            return
        closed = self._current
        if not closed.is_empty():
            if self._lifetime_closed is not None:
                self._lifetime_closed.merge_inplace(closed)
            if into_baseline:
                self._baseline.merge_inplace(closed)
        self._closed.append(closed)
        for _ in range(min(num_steps - 1, self._closed.maxlen or 0)):
            self._closed.append(new_digest(self._max_centroids))
        self._current = new_digest(self._max_centroids)
        self._window_cache = None

    def window(self) -> TDigest:
        """The sliding window (closed sub-windows + current); cached until the next change."""
        if self._window_cache is None:
            self._window_cache = merge_all((*self._closed, self._current), self._max_centroids)
        return self._window_cache

    def lifetime(self) -> TDigest:
        """Every value ever folded (closed sub-windows + current), as a new digest."""
        if self._lifetime_closed is None:
            raise ValueError("this series keeps no lifetime digest")
        return merge_all((self._lifetime_closed, self._current), self._max_centroids)

    @property
    def baseline(self) -> TDigest:
        """The reference digest (being learned or frozen); do not mutate."""
        return self._baseline

    def reset_baseline(self) -> None:
        """Forget the baseline so that it is learned again."""
        self._baseline = new_digest(self._max_centroids)
