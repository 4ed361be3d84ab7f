"""The closed digests kept for one latency series: sub-window ring, lifetime, baseline.

A series is one (route, stage) pair, or one segment of it (a batch-size
bucket or cache hit/miss) kept only for attribution::

    time ->   ... | sw[-3] | sw[-2] | sw[-1] | current |
                  '------- closed (<= N-1) -------'
    window   = merge(closed) + current                 (between N-1 and N sub-windows long)
    lifetime = lifetime_closed + current               (every closed sub-window merged once)
    baseline = closed sub-windows of the learning interval, then frozen

The current sub-window is not kept here: samples are folded into cells
(``monitoring.stage_digests``) and a series' current sub-window is the merge
of its cells, handed in when it is read and when it closes. Lifetime and
baseline grow by merging a sub-window when it closes, so their per-sample cost
is nil. Rotation is driven from outside, in lockstep for every series, by the
``Monitor`` that owns the clock.

Digests that absorb merge after merge (lifetime, baseline, the merged closed
sub-windows) keep twice ``max_centroids`` and are compressed to
``max_centroids`` when handed out. Compressing to the final size at every
merge lets mid-distribution centroids grow past the t-digest bound: over 24
draws of 10^6 lognormal and Pareto samples in 12 cells, 4 lifetimes in 48 read
the median 1e-4 to 5e-4 off in rank; with the headroom no window or lifetime
is beyond 7e-5 at any quantile.
"""

from __future__ import annotations

from collections import deque

from fastdigest import TDigest

from monitoring.digest import merge_all, new_digest

# Centroids of a digest that absorbs many merges, as a multiple of what it hands out.
_MERGED_HEADROOM = 2


class SeriesDigests:
    """Sub-window ring, lifetime and baseline digests of one series.

    Not thread-safe: the ``Monitor`` serialises every call under its lock.

    Args:
        max_centroids: Centroids per digest.
        num_sub_windows: Sub-windows in the window, the current one included.
        keep_lifetime: Whether to keep a lifetime digest (segments do not).
    """

    __slots__ = (
        "_max_centroids", "_merged_centroids", "_closed", "_closed_merged", "_lifetime_closed", "_baseline",
        "_baseline_out",
    )

    def __init__(self, max_centroids: int, num_sub_windows: int, keep_lifetime: bool) -> None:
        self._max_centroids = max_centroids
        self._merged_centroids = _MERGED_HEADROOM * max_centroids
        self._closed: deque[TDigest] = deque(maxlen=max(num_sub_windows - 1, 0))
        self._closed_merged: TDigest | None = None
        self._lifetime_closed: TDigest | None = new_digest(self._merged_centroids) if keep_lifetime else None
        self._baseline = new_digest(self._merged_centroids)
        self._baseline_out: TDigest | None = None

    def rotate(self, closed: TDigest, num_steps: int, into_baseline: bool) -> None:
        """Append the sub-window that just closed and slide the window by ``num_steps`` sub-windows.

        ``closed`` (owned by the series from now on) joins the lifetime
        digest, and the baseline when ``into_baseline`` (the baseline is being
        learned). Steps beyond the first are sub-windows in which nothing was
        folded (the monitor was idle); they enter the ring empty.
        """
        if num_steps <= 0:
            return
        if not closed.is_empty():
            if self._lifetime_closed is not None:
                self._lifetime_closed = merge_all((self._lifetime_closed, closed), self._merged_centroids)
            if into_baseline:
                self._baseline = merge_all((self._baseline, closed), self._merged_centroids)
                self._baseline_out = None
        self._closed.append(closed)
        for _ in range(min(num_steps - 1, self._closed.maxlen or 0)):
            self._closed.append(new_digest(self._max_centroids))
        self._closed_merged = None

    def window(self, current: TDigest) -> TDigest:
        """The sliding window: the closed sub-windows plus ``current``, as a new digest.

        The closed sub-windows are merged once per rotation, not once per read.
        """
        if self._closed_merged is None:
            self._closed_merged = merge_all(self._closed, self._merged_centroids)
        return merge_all((self._closed_merged, current), self._max_centroids)

    def lifetime(self, current: TDigest) -> TDigest:
        """Every value ever folded (closed sub-windows plus ``current``), as a new digest."""
        if self._lifetime_closed is None:
            raise ValueError("this series keeps no lifetime digest")
        return merge_all((self._lifetime_closed, current), self._max_centroids)

    @property
    def baseline(self) -> TDigest:
        """The reference digest (being learned or frozen), kept until it changes; do not mutate."""
        if self._baseline_out is None:
            self._baseline_out = merge_all((self._baseline,), self._max_centroids)
        return self._baseline_out

    def reset_baseline(self) -> None:
        """Forget the baseline so that it is learned again."""
        self._baseline = new_digest(self._merged_centroids)
        self._baseline_out = None
