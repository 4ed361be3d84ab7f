"""Exact statistics over a run's samples: percentiles, rates, lag, timeline.

This is the client, not the server's hot path: a run holds at most a few
million samples, so percentiles are exact nearest-rank values over the sorted
latencies (the value below which at least q of the samples fall), with no
interpolation that would invent a latency nobody saw.

Latency percentiles cover every request sent, whatever its outcome (a 503 or a
client timeout is a latency the user experienced too); ``ok`` and
``errors_by_status`` say how many of them succeeded.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.loadgen.runner import RunResult, Sample

PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50_ms", 0.50),
    ("p90_ms", 0.90),
    ("p99_ms", 0.99),
    ("p999_ms", 0.999),
    ("p9999_ms", 0.9999),
)
_TIMELINE_BIN_WIDTHS_S: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
_MAX_TIMELINE_BINS = 60


def nearest_rank(sorted_values: Sequence[float], quantile: float) -> float | None:
    """The nearest-rank quantile of already sorted values; ``None`` when there are none."""
    if not sorted_values:
        return None
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    rank = max(1, math.ceil(quantile * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass(frozen=True)
class LatencySummary:
    """Latency percentiles in ms (``None`` when there were no samples)."""

    percentiles_ms: tuple[tuple[str, float | None], ...]
    mean_ms: float | None
    max_ms: float | None


@dataclass(frozen=True)
class GroupStats:
    """What happened to one group of requests (all of them, or one route's)."""

    sent: int
    ok: int
    errors_by_status: dict[str, int]
    achieved_rate_rps: float
    throughput_rps: float
    latency: LatencySummary


@dataclass(frozen=True)
class LagSummary:
    """How far behind its schedule the generator sent, in ms."""

    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    num_measured: int


@dataclass(frozen=True)
class Timeline:
    """Per-bin series for plots: send rate, ok throughput, p99 by intended send time."""

    bin_s: float
    start_s: tuple[float, ...]
    sent_rps: tuple[float, ...]
    ok_rps: tuple[float, ...]
    p99_ms: tuple[float | None, ...]


@dataclass(frozen=True)
class RunWindows:
    """The time spans rates are computed over, in seconds after the run started.

    ``elapsed_s`` (what the answer rate is computed over) is at least the send window; ``last_answer_s`` is
    when the last HTTP answer (any status) came, ``None`` when none came.
    """

    send_window_s: float
    elapsed_s: float
    last_answer_s: float | None = None


def summarize_latency(latencies_s: Sequence[float]) -> LatencySummary:
    ordered_ms = sorted(latency_s * 1000.0 for latency_s in latencies_s)
    if not ordered_ms:
        return LatencySummary(tuple((name, None) for name, _ in PERCENTILES), None, None)
    return LatencySummary(
        percentiles_ms=tuple((name, nearest_rank(ordered_ms, q)) for name, q in PERCENTILES),
        mean_ms=sum(ordered_ms) / len(ordered_ms),
        max_ms=ordered_ms[-1],
    )


def run_windows(result: RunResult) -> RunWindows:
    """Send window: the scheduled window, stretched if sends ran late; elapsed: until the last answer."""
    last_sent_s = max((s.sent_s for s in result.samples if s.sent_s is not None), default=0.0)
    last_done_s = max((s.done_s for s in result.samples), default=0.0)
    send_window_s = max(result.schedule_window_s, last_sent_s)
    last_answer_s = max((s.done_s for s in result.samples if s.status > 0), default=None)
    return RunWindows(
        send_window_s=send_window_s, elapsed_s=max(last_done_s, send_window_s), last_answer_s=last_answer_s
    )


def group_stats(samples: Sequence[Sample], windows: RunWindows) -> GroupStats:
    errors = Counter(sample.outcome for sample in samples if not sample.is_ok)
    num_ok = sum(1 for sample in samples if sample.is_ok)
    return GroupStats(
        sent=len(samples),
        ok=num_ok,
        errors_by_status=dict(sorted(errors.items())),
        achieved_rate_rps=len(samples) / windows.send_window_s if windows.send_window_s > 0 else 0.0,
        throughput_rps=num_ok / windows.elapsed_s if windows.elapsed_s > 0 else 0.0,
        latency=summarize_latency([sample.latency_s for sample in samples]),
    )


def stats_by_route(samples: Sequence[Sample], windows: RunWindows) -> dict[str, GroupStats]:
    """Per route; a request's route is the server's answer, or the requested modality on error."""
    groups: dict[str, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(sample.route, []).append(sample)
    return {route: group_stats(groups[route], windows) for route in sorted(groups)}


def summarize_lag(samples: Sequence[Sample]) -> LagSummary:
    lags_ms = sorted(max(0.0, lag_s) * 1000.0 for s in samples if (lag_s := s.lag_s) is not None)
    return LagSummary(
        p50_ms=nearest_rank(lags_ms, 0.50),
        p99_ms=nearest_rank(lags_ms, 0.99),
        max_ms=lags_ms[-1] if lags_ms else None,
        num_measured=len(lags_ms),
    )


def is_generator_bottleneck(lag: LagSummary, max_lag_p99_ms: float) -> bool:
    """The generator, not the server, limited the run when its p99 lag exceeds the threshold."""
    return lag.p99_ms is not None and lag.p99_ms > max_lag_p99_ms


def timeline(samples: Sequence[Sample], windows: RunWindows) -> Timeline:
    bin_s = next(
        (width for width in _TIMELINE_BIN_WIDTHS_S if windows.elapsed_s / width <= _MAX_TIMELINE_BINS),
        _TIMELINE_BIN_WIDTHS_S[-1],
    )
    num_bins = max(1, math.ceil(windows.elapsed_s / bin_s))
    sent_counts = [0] * num_bins
    ok_counts = [0] * num_bins
    latencies_ms: list[list[float]] = [[] for _ in range(num_bins)]

    def bin_of(offset_s: float) -> int:
        return min(num_bins - 1, max(0, int(offset_s / bin_s)))

    for sample in samples:
        sent_counts[bin_of(sample.sent_s if sample.sent_s is not None else sample.intended_s)] += 1
        if sample.is_ok:
            ok_counts[bin_of(sample.done_s)] += 1
        latencies_ms[bin_of(sample.intended_s)].append(sample.latency_s * 1000.0)
    return Timeline(
        bin_s=bin_s,
        start_s=tuple(index * bin_s for index in range(num_bins)),
        sent_rps=tuple(count / bin_s for count in sent_counts),
        ok_rps=tuple(count / bin_s for count in ok_counts),
        p99_ms=tuple(nearest_rank(sorted(values), 0.99) for values in latencies_ms),
    )
