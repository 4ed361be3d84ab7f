"""Latency histograms per input value: how many samples of each (dimension, value) fell in each latency bin.

Attribution by input dimension needs, for the stage that moved, the share of
its slow tail that each value (``image_encoding=png``, ...) holds, in the
window and in the baseline. Digests per value would multiply the digest
cells by every dimension and cost each sample several digest insertions, so
the values get plain counts instead, on fixed log-spaced bins::

    bin   0          1 ... 56                                     57
          [0, 10 us) [10 us * r^(k-1), 10 us * r^k)  r = 10^(1/8)  [100 s, inf)

Eight bins a decade (each 33 % wide) from 10 us to 100 s: the slow-tail
threshold is the bin edge nearest the quantile it is asked at.

Counting happens at fold time, vectorised: each sample's bin from one
``np.log``, and one ``np.bincount`` per group of records over (input
combination seen in this fold, stage, bin), then the combinations are
projected onto the 34 values of ``monitoring.inputs`` with one matrix
product. A sample costs one bin and one count, not one per dimension.

Memory is fixed by construction: per (route, stage) recorded with inputs,
``num_sub_windows`` int32 arrays of (34 values, 58 bins) for the window ring
(the current sub-window included) and one int64 array for the baseline:
about (4 * 12 + 8) * 34 * 58 = 110 KB at the default 12 sub-windows, however
many distinct inputs the clients send (unknown labels fold into ``other``).
The arrays slide with the digests: the ``Monitor`` rotates both in one step.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from monitoring.inputs import NUM_VALUES, value_rows

BIN_LOW_S = 1e-5
BIN_HIGH_S = 100.0
BINS_PER_DECADE = 8
NUM_BINS = 2 + BINS_PER_DECADE * round(math.log10(BIN_HIGH_S / BIN_LOW_S))  # underflow + 56 + overflow

_LOG_LOW_NS = math.log(BIN_LOW_S * 1e9)
_BINS_PER_LOG = BINS_PER_DECADE / math.log(10)
# Folds with more input combinations than this count one dimension at a time
# (a bincount over combinations x stages x bins would otherwise grow with them).
_MAX_JOINT_COMBINATIONS = 512


def bin_of_ns(values_ns: np.ndarray) -> np.ndarray:
    """Bin index (int32) of each latency in nanoseconds; any shape.

    ``1 + (log(ns) - log(10 us)) * bins per log unit``, clipped to the bins
    and truncated: four passes over the samples.
    """
    with np.errstate(divide="ignore"):  # log(0) = -inf: the underflow bin
        position = np.log(values_ns, dtype=np.float64)
    position *= _BINS_PER_LOG
    position += 1.0 - _LOG_LOW_NS * _BINS_PER_LOG
    np.maximum(position, 0.0, out=position)  # two ufuncs cost half what np.clip does
    np.minimum(position, NUM_BINS - 1.0, out=position)
    # Below 10 us -> 0, [k-1, k) bins above 10 us -> k, from 100 s -> NUM_BINS - 1. Converting to
    # int32 costs a third of what int64 does.
    return position.astype(np.int32)


def bin_edges_s() -> np.ndarray:
    """The lower edge (seconds) of every bin; bin 0 starts at 0."""
    edges = BIN_LOW_S * 10.0 ** (np.arange(NUM_BINS - 1) / BINS_PER_DECADE)
    return np.concatenate(([0.0], edges))


def first_slow_bin(threshold_s: float) -> int:
    """The bin whose lower edge is nearest ``threshold_s`` (in log): counts from it on are the slow tail.

    Snapping to an edge (at most a factor ``10^(1/16)``, 15 %, from the
    threshold) keeps the tail counts whole samples, which the z-test of
    ``monitoring.input_attribution`` needs; interpolating inside a 33 % bin
    would not be more accurate (a tail's density falls across the bin).
    """
    if not threshold_s > BIN_LOW_S:
        return 1
    position = math.log(threshold_s / BIN_LOW_S) * _BINS_PER_LOG  # 0 at the lower edge of bin 1
    return min(int(math.floor(position + 0.5)) + 1, NUM_BINS - 1)


def count_inputs(codes: np.ndarray, values_ns: np.ndarray) -> np.ndarray:
    """Counts ``(num_stages, NUM_VALUES, NUM_BINS)`` of ``(num_rows, num_stages)`` ns whose rows have ``codes``.

    Rows with a negative code (recorded without inputs) are left out.
    """
    num_stages = values_ns.shape[1]
    counts = np.zeros((num_stages, NUM_VALUES, NUM_BINS), dtype=np.int64)  # (S, V, B)
    kept = codes >= 0
    if not kept.all():
        codes, values_ns = codes[kept], values_ns[kept]
    if not codes.size:
        return counts
    bins = bin_of_ns(values_ns)  # (R, S)
    present = np.flatnonzero(np.bincount(codes))  # the combinations in this fold
    if present.size <= _MAX_JOINT_COMBINATIONS:
        local = np.zeros(present[-1] + 1, dtype=np.int64)
        local[present] = np.arange(present.size)
        _add_projected(counts, local[codes], value_rows(present), bins)
    else:
        rows = value_rows(codes)  # (R, num_dimensions)
        for d in range(rows.shape[1]):
            values = np.unique(rows[:, d])
            local = np.zeros(NUM_VALUES, dtype=np.int64)
            local[values] = np.arange(values.size)
            _add_projected(counts, local[rows[:, d]], values[:, None], bins)
    return counts


def _add_projected(counts: np.ndarray, group: np.ndarray, group_rows: np.ndarray, bins: np.ndarray) -> None:
    """Add to ``counts`` (S, V, B) the rows' samples; row r is in ``group[r]``, which counts for ``group_rows[g]`` (G, D)."""
    num_groups = group_rows.shape[0]
    num_stages = bins.shape[1]
    # (R, S): (group * S + stage) * B + bin; int32 holds it (G <= 26 880 combinations, S * B small).
    flat = bins + np.arange(0, num_stages * NUM_BINS, NUM_BINS, dtype=np.int32)
    flat += (group.astype(np.int32) * (num_stages * NUM_BINS))[:, None]
    by_group = np.bincount(flat.ravel(), minlength=num_groups * num_stages * NUM_BINS)
    by_group = by_group.reshape(num_groups, num_stages * NUM_BINS).astype(np.float64)  # (G, S*B)
    projection = np.zeros((NUM_VALUES, num_groups))  # (V, G): 1 where group g counts for value v
    for column in group_rows.T:  # one dimension at a time: each group has one value in it
        projection[column, np.arange(num_groups)] = 1.0
    by_value = projection @ by_group  # (V, S*B), exact: counts stay far below 2^53
    counts += np.rint(by_value).astype(np.int64).reshape(NUM_VALUES, num_stages, NUM_BINS).transpose(1, 0, 2)


class InputHistograms:
    """Counts per (input value, latency bin) of one (route, stage): the window ring and the baseline.

    Not thread-safe: the ``Monitor`` serialises every call under its lock.

    Args:
        num_sub_windows: Sub-windows in the window, the current one included
            (as for the digests of the same series).
    """

    __slots__ = ("_current", "_closed", "_baseline")

    def __init__(self, num_sub_windows: int) -> None:
        self._current = np.zeros((NUM_VALUES, NUM_BINS), dtype=np.int32)  # (V, B)
        self._closed: deque[np.ndarray | None] = deque(maxlen=max(num_sub_windows - 1, 0))  # None: empty
        self._baseline = np.zeros((NUM_VALUES, NUM_BINS), dtype=np.int64)  # (V, B)

    def add(self, counts: np.ndarray) -> None:
        """Add one fold's ``(NUM_VALUES, NUM_BINS)`` counts to the current sub-window."""
        self._current += counts.astype(np.int32, copy=False)

    def rotate(self, num_steps: int, into_baseline: bool) -> None:
        """Close the current sub-window (into the baseline while it is learned) and slide by ``num_steps``."""
        if num_steps <= 0:
            return
        closed = self._current if self._current.any() else None
        if closed is not None and into_baseline:
            self._baseline += closed
        self._closed.append(closed)
        for _ in range(min(num_steps - 1, self._closed.maxlen or 0)):
            self._closed.append(None)
        self._current = np.zeros((NUM_VALUES, NUM_BINS), dtype=np.int32)

    def window(self) -> np.ndarray:
        """Counts of the sliding window, ``(NUM_VALUES, NUM_BINS)`` int64 (a new array)."""
        window = self._current.astype(np.int64)
        for closed in self._closed:
            if closed is not None:
                window += closed
        return window

    @property
    def baseline(self) -> np.ndarray:
        """Counts of the baseline (being learned or frozen); do not mutate."""
        return self._baseline

    def reset_baseline(self) -> None:
        """Forget the baseline so that it is learned again."""
        self._baseline = np.zeros((NUM_VALUES, NUM_BINS), dtype=np.int64)
