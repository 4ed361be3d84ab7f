"""From hot-path records to per-series arrays of seconds, off the hot path.

``Monitor.record`` only appends ``(route, stage_ns, batch_size, cache_hit)``
to a deque (thread-safe append/popleft, no lock). The folder drains the deque
and turns it into one float64 array per series with as little per-sample
Python as possible:

1. group records by ``(route, batch_size, cache_hit, number of stages)``:
   one small tuple and one dict lookup per *record*, not per sample;
2. per group, read the first record's stage names from every record with
   one ``operator.itemgetter`` and convert them in one ``np.fromiter``,
   reshaped to ``(num_records, num_stages)``: column j is stage j;
3. scale nanoseconds to seconds and concatenate columns per series
   (all traffic, batch-size bucket, cache hit/miss).

A group that breaks the fast path (records with other stage names of the
same count, a value that is not a number, a negative or non-finite time)
falls back to a per-record path that skips and counts the bad records, so one
malformed call cannot stop the folder.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from monitoring.series import ALL_TRAFFIC, SeriesKey

Record = tuple[str, Mapping[str, int], int | None, bool | None]
"""What ``Monitor.record`` appends: ``(route, stage_ns, batch_size, cache_hit)``."""

BATCH_SIZE_DIMENSION = "batch_size"
CACHE_DIMENSION = "cache"

_NS_PER_S = 1e9
# Upper edges of the batch-size buckets; sizes above the last edge share one bucket.
_BATCH_BUCKET_EDGES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


def batch_size_bucket(batch_size: int) -> str:
    """Label of the bucket ``batch_size`` falls in: ``"1"``, ``"2"``, ``"3-4"``, ..., ``"65+"``."""
    lower = 1
    for upper in _BATCH_BUCKET_EDGES:
        if batch_size <= upper:
            return str(upper) if lower == upper else f"{lower}-{upper}"
        lower = upper + 1
    return f"{lower}+"


def cache_label(cache_hit: bool) -> str:
    """``"hit"`` or ``"miss"``, the value of the cache segment."""
    return "hit" if cache_hit else "miss"


@dataclass(frozen=True)
class FoldResult:
    """Arrays (seconds) per series from one drain, and how many records were unusable."""

    values_s: Mapping[SeriesKey, np.ndarray]
    num_records: int
    num_invalid_records: int


def fold_records(records: Sequence[Record]) -> FoldResult:
    """Group ``records`` and return one float64 array of seconds per series."""
    groups: dict[tuple[str, int | None, bool | None, int], list[Mapping[str, int]]] = {}
    for route, stage_ns, batch_size, cache_hit in records:
        key = (route, batch_size, cache_hit, len(stage_ns))
        try:
            groups[key].append(stage_ns)
        except KeyError:
            groups[key] = [stage_ns]

    columns: defaultdict[SeriesKey, list[np.ndarray]] = defaultdict(list)
    num_invalid = 0
    for (route, batch_size, cache_hit, _), rows in groups.items():
        stage_columns_s, num_bad = _stage_columns_s(rows)
        num_invalid += num_bad
        segments: list[tuple[str, str]] = [(ALL_TRAFFIC, "")]
        if isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size > 0:
            segments.append((BATCH_SIZE_DIMENSION, batch_size_bucket(batch_size)))
        if isinstance(cache_hit, bool):
            segments.append((CACHE_DIMENSION, cache_label(cache_hit)))
        for stage, column_s in stage_columns_s.items():
            if column_s.size:
                for dimension, value in segments:
                    columns[SeriesKey(str(route), str(stage), dimension, value)].append(column_s)

    values_s = {
        series: parts[0] if len(parts) == 1 else np.concatenate(parts) for series, parts in columns.items()
    }
    return FoldResult(values_s=values_s, num_records=len(records), num_invalid_records=num_invalid)


def _stage_columns_s(rows: list[Mapping[str, int]]) -> tuple[dict[str, np.ndarray], int]:
    """Seconds per stage for rows that (almost always) share their stage names; also rows dropped.

    Fast path: the first row's names, read from every row with one
    ``itemgetter`` (any key order, any Mapping) and converted in one
    ``np.fromiter``. A row with other names (``KeyError``), a value that is not
    a number, or a negative or non-finite time sends the group to the
    per-row path.
    """
    stages = tuple(rows[0])
    num_stages = len(stages)
    if num_stages == 0:
        return {}, 0
    getter = itemgetter(*stages)
    try:
        if num_stages == 1:
            flat_ns = np.fromiter(map(getter, rows), dtype=np.float64, count=len(rows))
        else:
            flat_ns = np.fromiter(
                itertools.chain.from_iterable(map(getter, rows)), dtype=np.float64, count=len(rows) * num_stages
            )
    except (KeyError, TypeError, ValueError):
        return _stage_columns_slow_s(rows)
    if not (np.isfinite(flat_ns).all() and (flat_ns >= 0).all()):
        return _stage_columns_slow_s(rows)
    matrix_s = flat_ns.reshape(len(rows), num_stages) / _NS_PER_S  # (num_rows, num_stages)
    return {stage: matrix_s[:, j] for j, stage in enumerate(stages)}, 0


def _stage_columns_slow_s(rows: list[Mapping[str, int]]) -> tuple[dict[str, np.ndarray], int]:
    """Per-row path: keeps every valid row whole, drops (and counts) rows with a bad time."""
    kept: defaultdict[str, list[float]] = defaultdict(list)
    num_bad = 0
    for row in rows:
        try:
            values = [(str(stage), float(ns)) for stage, ns in row.items()]
        except (TypeError, ValueError, AttributeError):
            num_bad += 1
            continue
        if not all(math.isfinite(v) and v >= 0 for _, v in values):
            num_bad += 1
            continue
        for stage, ns in values:
            kept[stage].append(ns)
    return {stage: np.asarray(ns, dtype=np.float64) / _NS_PER_S for stage, ns in kept.items()}, num_bad
