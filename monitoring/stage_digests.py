"""Every digest of one (route, stage): samples go into cells, series are read as merges of cells.

A cell is one (batch-size bucket, cache outcome) of the stage, and each
sample is inserted into exactly one digest: its cell's. The series that the
exports and attribution read are unions of cells::

    cells, current sub-window        series                 merged from         closed sub-windows kept as
    -------------------------        ------                 -----------         --------------------------
    ("1",   "hit")  ("1",   "miss")  all traffic            every cell          ring, lifetime, baseline
    ("3-4", "hit")  ("3-4", "miss")  batch_size=1           ("1", *)            ring, baseline
                                     batch_size=3-4         ("3-4", *)          ring, baseline
                                     cache=hit, cache=miss  (*, "hit"), ...     ring, baseline

Feeding the all-traffic digest, the batch-size segment and the cache segment
of every sample cost three digest insertions per sample; a cell costs one. The
merges move to the close of a sub-window (each series' sub-window is merged
from its cells once and kept by ``monitoring.series``) and to the rare reads
(a drift period, a scrape, a digests document), which merge the cells of the
sub-window in progress and keep the result until the next fold.

Cells keep ``max_centroids`` centroids, as many as the all-traffic digests:
when all traffic falls in one cell (no batch size or cache outcome recorded),
that cell *is* the all-traffic distribution and must be as accurate. Segments
(``segment_max_centroids``) read each cell through a copy compressed to their
size: merging compressed copies costs a tenth of merging full cells.

A cell holds a few folds' values back and inserts them in one
``batch_update``: each call has a fixed cost (it merges into every centroid
the digest already has), which dominates arrays of a few hundred values, the
size a cell receives per fold at moderate traffic. The values wait at most
until the next read or the close of the sub-window, whichever comes first.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from fastdigest import TDigest

from monitoring.attribution import DigestPair
from monitoring.digest import merge_all, new_digest
from monitoring.ingest import CellKey
from monitoring.series import SeriesDigests
from monitoring.sliding_count import SlidingCount

# Values a cell buffers before it inserts them. Into 2000 centroids, a batch_update
# of 8192 values costs ~64 ns a value, of 1000 values ~82 ns, of 10^5 no less than 8192.
_MIN_BATCH_VALUES = 8192

Segment = tuple[str, str]
"""``(dimension, value)``, e.g. ``("cache", "miss")``."""

CellLabel = tuple[str, str]
"""``(batch_bucket, cache)`` of a cell within its (route, stage)."""


class _Cell:
    """The current sub-window of one cell: a digest, the values not yet inserted, a compressed copy."""

    __slots__ = ("_max_centroids", "_segment_max_centroids", "_digest", "_compact", "_pending", "_num_pending")

    def __init__(self, max_centroids: int, segment_max_centroids: int) -> None:
        self._max_centroids = max_centroids
        self._segment_max_centroids = segment_max_centroids
        self._digest = new_digest(max_centroids)
        self._compact: TDigest | None = None
        self._pending: list[np.ndarray] = []
        self._num_pending = 0

    def add(self, values_s: np.ndarray) -> None:
        self._pending.append(values_s)
        self._num_pending += values_s.size
        self._compact = None
        if self._num_pending >= _MIN_BATCH_VALUES:
            self._insert_pending()

    def digest(self) -> TDigest:
        """The cell's digest with every value added so far; owned by the cell until ``close``."""
        if self._pending:
            self._insert_pending()
        return self._digest

    def compact(self) -> TDigest:
        """The cell compressed to ``segment_max_centroids``, for segment reads; do not mutate."""
        if self._compact is None:
            self._compact = merge_all((self.digest(),), self._segment_max_centroids)
        return self._compact

    def close(self) -> None:
        """Start the next sub-window empty."""
        self._digest = new_digest(self._max_centroids)
        self._compact = None
        self._pending.clear()
        self._num_pending = 0

    def _insert_pending(self) -> None:
        pending = self._pending
        self._digest.batch_update(pending[0] if len(pending) == 1 else np.concatenate(pending))
        pending.clear()
        self._num_pending = 0


class StageDigests:
    """Cells of one (route, stage) and the all-traffic and segment series built from them.

    Not thread-safe: the ``Monitor`` serialises every call under its lock.

    Args:
        max_centroids: Centroids of every cell and of the all-traffic digests.
        segment_max_centroids: Centroids of the segment digests (attribution only).
        num_sub_windows: Sub-windows in the window, the current one included.
    """

    def __init__(self, max_centroids: int, segment_max_centroids: int, num_sub_windows: int) -> None:
        self._max_centroids = max_centroids
        self._segment_max_centroids = segment_max_centroids
        self._num_sub_windows = num_sub_windows
        self._cells: dict[CellLabel, _Cell] = {}
        self._cell_segments: dict[CellLabel, tuple[Segment, ...]] = {}
        self._all_traffic = SeriesDigests(max_centroids, num_sub_windows, keep_lifetime=True)
        self._batches = SlidingCount(num_sub_windows)  # all traffic's samples counted in batches
        self._segments: dict[Segment, SeriesDigests] = {}
        # The current sub-window of each series (None: all traffic), merged from
        # its cells on first read; dropped whenever a cell changes.
        self._current: dict[Segment | None, TDigest] = {}
        self._window: dict[Segment | None, TDigest] = {}

    def add(self, cell: CellKey, values_s: np.ndarray, num_batches: float | None = None) -> None:
        """Fold latencies (seconds, float64) into ``cell``'s current sub-window.

        ``num_batches``: the batches they came from (``FoldResult.num_batches``);
        ``None`` counts every sample as its own.
        """
        if not values_s.size:
            return
        self._batches.add(float(values_s.size) if num_batches is None else num_batches)
        label = (cell.batch_bucket, cell.cache)
        target = self._cells.get(label)
        if target is None:
            target = self._cells[label] = _Cell(self._max_centroids, self._segment_max_centroids)
            self._cell_segments[label] = cell.segments
            for segment in cell.segments:
                if segment not in self._segments:
                    self._segments[segment] = SeriesDigests(
                        self._segment_max_centroids, self._num_sub_windows, keep_lifetime=False
                    )
        target.add(values_s)
        if self._current:
            self._current.clear()
            self._window.clear()

    def rotate(self, num_steps: int, into_baseline: bool) -> None:
        """Close the current sub-window of every series and slide the windows by ``num_steps``."""
        if num_steps <= 0:
            return
        self._all_traffic.rotate(self._current_of(None), num_steps, into_baseline)
        self._batches.rotate(num_steps, into_baseline)
        for segment, series in self._segments.items():
            series.rotate(self._current_of(segment), num_steps, into_baseline)
        for cell in self._cells.values():
            cell.close()
        self._current.clear()
        self._window.clear()

    def window(self) -> TDigest:
        """All traffic's sliding window; kept until the next fold or rotation."""
        return self._window_of(None, self._all_traffic)

    def lifetime(self) -> TDigest:
        """All traffic since the monitor started, as a new digest."""
        return self._all_traffic.lifetime(self._current_of(None))

    @property
    def baseline(self) -> TDigest:
        """All traffic's baseline (being learned or frozen); do not mutate."""
        return self._all_traffic.baseline

    def batch_counts(self) -> tuple[float, float]:
        """All traffic's samples counted in batches: ``(window, baseline)``, the independent observations."""
        return self._batches.window, self._batches.baseline

    def reset_baseline(self) -> None:
        """Forget every series' baseline so that it is learned again."""
        self._all_traffic.reset_baseline()
        self._batches.reset_baseline()
        for series in self._segments.values():
            series.reset_baseline()

    def segment_pairs(self) -> dict[Segment, DigestPair]:
        """``{(dimension, value): (window, baseline)}`` of every segment seen so far."""
        return {
            segment: (self._window_of(segment, series), series.baseline)
            for segment, series in self._segments.items()
        }

    def _window_of(self, segment: Segment | None, series: SeriesDigests) -> TDigest:
        window = self._window.get(segment)
        if window is None:
            window = self._window[segment] = series.window(self._current_of(segment))
        return window

    def _current_of(self, segment: Segment | None) -> TDigest:
        """The current sub-window of all traffic (``None``) or of one segment, merged from its cells."""
        current = self._current.get(segment)
        if current is None:
            if segment is None:
                digests: Iterable[TDigest] = (cell.digest() for cell in self._cells.values())
                max_centroids = self._max_centroids
            else:
                digests = (
                    cell.compact() for label, cell in self._cells.items() if segment in self._cell_segments[label]
                )
                max_centroids = self._segment_max_centroids
            current = self._current[segment] = merge_all(digests, max_centroids)
        return current
