"""From hot-path records to one array of seconds per cell, off the hot path.

``Monitor.record`` only appends ``(route, stage_ns, batch_size, cache_hit,
inputs)`` to a deque (thread-safe append/popleft, no lock). The folder drains the deque
and turns it into one float64 array per **cell** -- a (route, stage,
batch-size bucket, cache outcome); a sample goes to exactly one cell, and the
all-traffic and segment series are unions of cells merged when read
(``monitoring.stage_digests``) -- with as little per-sample Python as possible:

1. group records by ``(route, number of stages)``, keeping their order, and
   number each record's ``(batch_size, cache_hit)`` pair: one small tuple and
   one dict lookup per *record*, not per sample;
2. per group, read the first record's stage names from every record with
   one ``operator.itemgetter`` and convert them in one ``np.fromiter`` into a
   ``(num_records, num_stages)`` matrix, in record order (reading the records
   cell by cell instead strides through memory and costs ~35 % more);
3. sort the rows by pair number (stable, one gather), scale nanoseconds to
   seconds into a stage-major array, and cut it into one contiguous run per
   pair; pairs in the same cell (batch sizes 3 and 4) are concatenated.

Each cell also gets its samples counted in batches: a sample of a request
served in a batch of b counts ``1 / b`` (a record without a batch size counts
1), which the drift rule's noise floor reads as the number of independent
observations (``monitoring.sliding_count``). The pairs already split records
by exact batch size, so this is one division per run, not per sample.

Records that carry ``RequestInputs`` are also counted per input value and
latency bin for each (route, stage) (``monitoring.input_histograms``), from
the same ``(num_records, num_stages)`` matrix: one int read per record and
one bin and count per sample.

A group that breaks the fast path (records with other stage names of the
same count, a value that is not a number, a negative or non-finite time)
falls back to a per-record path that skips and counts the bad records, so one
malformed call cannot stop the folder.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
import dataclasses
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from monitoring.input_histograms import count_inputs
from monitoring.inputs import NUM_COMBINATIONS, RequestInputs

Record = tuple[str, Mapping[str, int], int | None, bool | None, RequestInputs | None]
"""What ``Monitor.record`` appends: ``(route, stage_ns, batch_size, cache_hit, inputs)``."""

NO_INPUTS_CODE = -1
"""The code of a record without inputs: it joins no input histogram."""

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


NOT_RECORDED = ""
"""A cell's ``batch_bucket`` or ``cache`` when the record did not say (it joins no segment of that dimension)."""


class CellKey(NamedTuple):
    """The finest slice of a (route, stage): one batch-size bucket and one cache outcome."""

    route: str
    stage: str
    batch_bucket: str = NOT_RECORDED
    cache: str = NOT_RECORDED

    @property
    def segments(self) -> tuple[tuple[str, str], ...]:
        """The ``(dimension, value)`` segments this cell's samples belong to."""
        segments = []
        if self.batch_bucket != NOT_RECORDED:
            segments.append((BATCH_SIZE_DIMENSION, self.batch_bucket))
        if self.cache != NOT_RECORDED:
            segments.append((CACHE_DIMENSION, self.cache))
        return tuple(segments)


@dataclass(frozen=True)
class FoldResult:
    """Arrays (seconds) per cell from one drain, counts per input value, and how many records were unusable.

    ``input_counts`` maps ``(route, stage)`` to ``(NUM_VALUES, NUM_BINS)``
    counts of the samples recorded with inputs (absent when there were none).
    ``num_batches`` holds, per cell, its samples counted in batches (each
    ``1 / batch_size``; 1 without a batch size): the batches they came from.
    """

    values_s: Mapping[CellKey, np.ndarray]
    num_records: int
    num_invalid_records: int
    input_counts: Mapping[tuple[str, str], np.ndarray] = dataclasses.field(default_factory=dict)
    num_batches: Mapping[CellKey, float] = dataclasses.field(default_factory=dict)


def _is_batch_size(batch_size: object) -> bool:
    return isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size > 0


def batch_share(batch_size: object) -> float:
    """What one sample of a request served in a batch of ``batch_size`` counts in batches (1 when not recorded)."""
    return 1.0 / batch_size if _is_batch_size(batch_size) else 1.0  # type: ignore[operator]


@functools.lru_cache(maxsize=4096, typed=True)  # each fold asks for the same few dozen cells
def cell_of(route: str, stage: str, batch_size: object, cache_hit: object) -> CellKey:
    """The cell of a sample; a batch size that is no positive int, or a cache outcome no bool, is not recorded."""
    return CellKey(
        str(route),
        str(stage),
        batch_size_bucket(batch_size) if _is_batch_size(batch_size) else NOT_RECORDED,  # type: ignore[arg-type]
        cache_label(cache_hit) if isinstance(cache_hit, bool) else NOT_RECORDED,
    )


def fold_records(records: Sequence[Record]) -> FoldResult:
    """Group ``records`` and return one float64 array of seconds per cell, and the input-value counts."""
    # Per (route, number of stages): the stage dicts in record order, each
    # record's pair number, the (batch_size, cache_hit) pair of each number,
    # and each record's inputs (mostly None or the same few interned objects).
    groups: dict[tuple[str, int], tuple[list[Mapping[str, int]], list[int], list[tuple[object, object]],
                                        list[RequestInputs | None]]] = {}
    # (route, number of stages, batch_size, cache_hit) -> where such a record goes.
    slots: dict[tuple[object, ...], tuple[Callable[[Mapping[str, int]], None], Callable[[int], None],
                                          Callable[[RequestInputs | None], None], int]] = {}
    for route, stage_ns, batch_size, cache_hit, inputs in records:
        key = (route, len(stage_ns), batch_size, cache_hit)
        try:
            append_row, append_id, append_inputs, pair_id = slots[key]
        except KeyError:
            rows, ids, pairs, inputs_list = groups.setdefault((route, len(stage_ns)), ([], [], [], []))
            slots[key] = (append_row, append_id, append_inputs, pair_id) = (
                rows.append, ids.append, inputs_list.append, len(pairs))
            pairs.append((batch_size, cache_hit))
        append_row(stage_ns)
        append_id(pair_id)
        append_inputs(inputs)

    columns: defaultdict[CellKey, list[np.ndarray]] = defaultdict(list)
    num_batches: defaultdict[CellKey, float] = defaultdict(float)
    input_counts: dict[tuple[str, str], np.ndarray] = {}
    num_invalid = 0
    for (route, _), (rows, id_list, pairs, inputs_list) in groups.items():
        codes = input_codes(inputs_list)
        converted = _stage_matrix_ns(rows)
        if converted is None:
            for pair_id, (batch_size, cache_hit) in enumerate(pairs):
                stage_columns_s, num_bad = _stage_columns_slow_s([r for r, i in zip(rows, id_list) if i == pair_id])
                num_invalid += num_bad
                for stage, (column_s, _) in stage_columns_s.items():
                    if column_s.size:
                        cell = cell_of(route, stage, batch_size, cache_hit)
                        columns[cell].append(column_s)
                        num_batches[cell] += column_s.size * batch_share(batch_size)
            if codes is not None:
                for stage, (column_s, kept_rows) in _stage_columns_slow_s(rows)[0].items():
                    column_ns = np.rint(column_s * _NS_PER_S)[:, None]  # (num_kept, 1)
                    _add_counts(input_counts, route, (stage,), count_inputs(codes[kept_rows], column_ns))
            continue
        stages, by_row_ns = converted
        if codes is not None:
            _add_counts(input_counts, route, stages, count_inputs(codes, by_row_ns))
        # The smallest integer type lets argsort use a radix sort.
        ids = np.array(id_list, dtype=np.min_scalar_type(len(pairs))) if len(pairs) > 1 else None
        for pair_id, run_s in _runs_by_id(by_row_ns, ids, len(pairs)):
            batch_size, cache_hit = pairs[pair_id]
            run_batches = run_s.shape[1] * batch_share(batch_size)
            for stage, column_s in zip(stages, run_s):
                cell = cell_of(route, stage, batch_size, cache_hit)
                columns[cell].append(column_s)
                num_batches[cell] += run_batches

    # Batch sizes that share a bucket (3 and 4) are two runs of one cell.
    values_s = {cell: parts[0] if len(parts) == 1 else np.concatenate(parts) for cell, parts in columns.items()}
    return FoldResult(values_s=values_s, num_records=len(records), num_invalid_records=num_invalid,
                      input_counts=input_counts, num_batches=dict(num_batches))


def input_codes(inputs_list: list[RequestInputs | None]) -> np.ndarray | None:
    """Each record's input combination code (``NO_INPUTS_CODE`` without one); ``None`` when no record has one.

    One attribute read per record (``list.count(None)`` would call the
    dataclass' ``__eq__`` on each). Anything without a valid code (a caller's
    mistake) counts as no inputs rather than stopping the fold.
    """
    if not any(inputs_list):
        return None
    try:
        codes = np.array([NO_INPUTS_CODE if i is None else i.code for i in inputs_list], dtype=np.int64)
    except (AttributeError, TypeError, ValueError, OverflowError):
        codes = np.array([i.code if isinstance(i, RequestInputs) else NO_INPUTS_CODE for i in inputs_list],
                         dtype=np.int64)
    is_valid = (codes >= 0) & (codes < NUM_COMBINATIONS)
    if not is_valid.any():
        return None
    codes[~is_valid] = NO_INPUTS_CODE
    return codes


def _add_counts(input_counts: dict[tuple[str, str], np.ndarray], route: str, stages: Sequence[str],
                counts: np.ndarray) -> None:
    """Add ``(num_stages, NUM_VALUES, NUM_BINS)`` counts to each ``(route, stage)``'s."""
    for stage, stage_counts in zip(stages, counts):
        key = (route, stage)
        if key in input_counts:
            input_counts[key] += stage_counts
        else:
            input_counts[key] = stage_counts


def _runs_by_id(by_row_ns: np.ndarray, ids: np.ndarray | None, num_ids: int) -> list[tuple[int, np.ndarray]]:
    """``(id, its seconds, stage-major)`` per id present, from ``(num_rows, num_stages)`` ns labelled by ``ids``.

    Rows are grouped by id (stable sort, one gather) and scaled into a
    stage-major array in one pass, so each cell's column is contiguous.
    """
    if ids is None or num_ids == 1:
        return [(0, np.divide(by_row_ns.T, _NS_PER_S, order="C"))]  # (num_stages, num_rows)
    order = np.argsort(ids, kind="stable")
    by_stage_s = np.divide(by_row_ns[order].T, _NS_PER_S, order="C")  # (num_stages, num_rows), rows grouped by id
    runs = []
    start = 0
    for pair_id, end in enumerate(np.cumsum(np.bincount(ids, minlength=num_ids)).tolist()):
        if end > start:
            runs.append((pair_id, by_stage_s[:, start:end]))  # (num_stages, rows of this id)
        start = end
    return runs


def _stage_matrix_ns(rows: list[Mapping[str, int]]) -> tuple[tuple[str, ...], np.ndarray] | None:
    """Stage names and nanoseconds as a ``(num_rows, num_stages)`` array; ``None`` when the fast path does not apply.

    The first row's names are read from every row with one ``itemgetter``
    (any key order, any Mapping) and converted in one ``np.fromiter``. A row
    with other names (``KeyError``), a value that is not a number, or a
    negative or non-finite time returns ``None``: the per-row path sorts it out.

    Times are ``perf_counter_ns`` integers and are read as int64, which costs
    ~15 % less than float64; a fraction of a nanosecond would be dropped.
    """
    stages = tuple(map(str, rows[0]))
    num_stages = len(stages)
    if num_stages == 0:
        return (), np.empty((len(rows), 0), dtype=np.int64)
    getter = itemgetter(*rows[0])
    try:
        if num_stages == 1:
            flat_ns = np.fromiter(map(getter, rows), dtype=np.int64, count=len(rows))
        else:
            flat_ns = np.fromiter(
                itertools.chain.from_iterable(map(getter, rows)), dtype=np.int64, count=len(rows) * num_stages
            )
    except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: beyond int64, or infinite
        return None
    if not (flat_ns >= 0).all():
        return None
    return stages, flat_ns.reshape(len(rows), num_stages)  # (num_rows, num_stages)


def _stage_columns_slow_s(rows: list[Mapping[str, int]]) -> tuple[dict[str, tuple[np.ndarray, list[int]]], int]:
    """Per-row path: keeps every valid row whole, drops (and counts) rows with a bad time.

    Returns, per stage, its seconds and the indices of the rows they came from.
    """
    kept: defaultdict[str, list[float]] = defaultdict(list)
    kept_rows: defaultdict[str, list[int]] = defaultdict(list)
    num_bad = 0
    for index, row in enumerate(rows):
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
            kept_rows[stage].append(index)
    columns_s = {stage: (np.asarray(ns, dtype=np.float64) / _NS_PER_S, kept_rows[stage]) for stage, ns in kept.items()}
    return columns_s, num_bad
