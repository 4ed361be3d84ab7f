"""The server's own view of a run, from ``/metrics`` scraped before and after it.

The client sees latency; only the server knows how well it batched, how long
requests sat in its queues and how often its cache answered. Counters and
histograms are cumulative, so the run's share is ``after - before``; a series
that is missing (older server, feature off, nothing recorded yet) becomes
``null`` in the report, never a crash. Series used:

    mmserve_batch_size_bucket/_sum/_count{lane}         histogram -> per-lane mean + bucket deltas
    mmserve_stage_latency_seconds{route,stage="queue"}  summary   -> mean wait (sum/count delta),
                                                                    quantiles as the server reports them
    mmserve_queue_depth{lane}                           gauge     -> depth after the run
    mmserve_cache_events_total{modality,event}          counter   -> hit ratio = hit / (hit+miss+coalesced)

Samples are matched by name, not by the declared family type, so a summary
exported as an untyped or gauge family still parses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

METRICS_PATH = "/metrics"
BATCH_BUCKET = "mmserve_batch_size_bucket"
BATCH_SUM = "mmserve_batch_size_sum"
BATCH_COUNT = "mmserve_batch_size_count"
QUEUE_DEPTH = "mmserve_queue_depth"
STAGE_LATENCY = "mmserve_stage_latency_seconds"
STAGE_LATENCY_SUM = "mmserve_stage_latency_seconds_sum"
STAGE_LATENCY_COUNT = "mmserve_stage_latency_seconds_count"
CACHE_EVENTS = "mmserve_cache_events_total"
QUEUE_STAGE = "queue"
_LOOKUP_EVENTS = ("hit", "miss", "coalesced")

SeriesKey = tuple[str, frozenset[tuple[str, str]]]


@dataclass(frozen=True)
class MetricsSnapshot:
    """Every sample of one scrape, by (sample name, label set)."""

    values: Mapping[SeriesKey, float]

    def select(self, name: str, **fixed_labels: str) -> list[tuple[dict[str, str], float]]:
        """Samples called ``name`` whose labels include ``fixed_labels``."""
        wanted = set(fixed_labels.items())
        return [
            (dict(labels), value)
            for (sample_name, labels), value in self.values.items()
            if sample_name == name and wanted <= labels
        ]


@dataclass(frozen=True)
class ScrapeResult:
    """A snapshot, or why there is none; ``is_unreachable``: no connection could be opened (refused, no such
    host), so the request never reached a server."""

    snapshot: MetricsSnapshot | None
    error: str | None
    is_unreachable: bool = False


def parse_metrics_text(text: str) -> MetricsSnapshot:
    """Parse Prometheus text exposition into a snapshot (raises ``ValueError`` on malformed text)."""
    values: dict[SeriesKey, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
    return MetricsSnapshot(values)


async def scrape(client: httpx.AsyncClient, timeout_s: float) -> ScrapeResult:
    """GET ``/metrics``; any failure is reported in ``error`` and never raised."""
    try:
        response = await client.get(METRICS_PATH, timeout=timeout_s)
    except (httpx.HTTPError, OSError) as e:
        is_unreachable = isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout, OSError))
        return ScrapeResult(None, f"GET {METRICS_PATH} failed: {type(e).__name__}: {e}", is_unreachable)
    if response.status_code != 200:
        return ScrapeResult(None, f"GET {METRICS_PATH} answered HTTP {response.status_code}")
    try:
        return ScrapeResult(parse_metrics_text(response.text), None)
    except ValueError as e:
        return ScrapeResult(None, f"GET {METRICS_PATH} returned unparseable text: {e}")


def _delta(after: float, before: float | None) -> float:
    """Growth of a cumulative series; a series that reset (server restart) counts from zero."""
    if before is None or after < before:
        return after
    return after - before


def _before_value(before: MetricsSnapshot | None, name: str, labels: Mapping[str, str]) -> float | None:
    if before is None:
        return None
    return before.values.get((name, frozenset(labels.items())))


def _le_bound(le: str) -> float:
    return math.inf if le in ("+Inf", "inf", "Inf") else float(le)


def batch_size_view(before: MetricsSnapshot | None, after: MetricsSnapshot) -> dict[str, Any] | None:
    """Per lane: mean batch size and per-bucket batch counts during the run, over every engine (each engine's
    series carries an ``engine`` label: summed here per lane)."""
    sums = after.select(BATCH_SUM)
    if not sums:
        return None
    view: dict[str, Any] = {}
    for labels, sum_after in sums:
        lane = labels.get("lane", "")
        count_labels = dict(labels)
        count_after = after.values.get((BATCH_COUNT, frozenset(count_labels.items())))
        if count_after is None:
            continue
        num_batches = _delta(count_after, _before_value(before, BATCH_COUNT, count_labels))
        num_requests = _delta(sum_after, _before_value(before, BATCH_SUM, labels))
        buckets = sorted(
            (
                (_le_bound(bucket_labels["le"]), bucket_labels["le"], value, bucket_labels)
                for bucket_labels, value in after.select(BATCH_BUCKET, **labels)
                if "le" in bucket_labels and len(bucket_labels) == len(labels) + 1
            ),
            key=lambda item: item[0],
        )
        entry = view.setdefault(lane, {"mean": None, "num_batches": 0.0, "num_requests": 0.0, "histogram": None})
        histogram: dict[str, float] = entry["histogram"] or {}
        previous_cumulative = 0.0
        for _, le_text, value, bucket_labels in buckets:
            cumulative = _delta(value, _before_value(before, BATCH_BUCKET, bucket_labels))
            histogram[le_text] = histogram.get(le_text, 0.0) + cumulative - previous_cumulative
            previous_cumulative = cumulative
        entry["num_batches"] += num_batches
        entry["num_requests"] += num_requests
        entry["histogram"] = histogram or None
        entry["mean"] = entry["num_requests"] / entry["num_batches"] if entry["num_batches"] > 0 else None
    return view or None


def queue_wait_view(before: MetricsSnapshot | None, after: MetricsSnapshot) -> dict[str, Any] | None:
    """Per route: mean queue wait during the run, and the server's own quantiles after it."""
    counts = after.select(STAGE_LATENCY_COUNT, stage=QUEUE_STAGE)
    quantile_samples = after.select(STAGE_LATENCY, stage=QUEUE_STAGE)
    if not counts and not quantile_samples:
        return None
    view: dict[str, Any] = {}
    for labels, count_after in counts:
        route = labels.get("route", "")
        sum_after = after.values.get((STAGE_LATENCY_SUM, frozenset(labels.items())))
        num_waits = _delta(count_after, _before_value(before, STAGE_LATENCY_COUNT, labels))
        mean_ms: float | None = None
        if sum_after is not None and num_waits > 0:
            mean_ms = _delta(sum_after, _before_value(before, STAGE_LATENCY_SUM, labels)) / num_waits * 1000.0
        view[route] = {"mean_ms": mean_ms, "count": num_waits, "quantiles_ms": None}
    for labels, value_s in quantile_samples:
        if "quantile" not in labels:
            continue
        route = labels.get("route", "")
        entry = view.setdefault(route, {"mean_ms": None, "count": None, "quantiles_ms": None})
        quantiles = entry["quantiles_ms"] or {}
        quantiles[labels["quantile"]] = value_s * 1000.0 if math.isfinite(value_s) else None
        entry["quantiles_ms"] = dict(sorted(quantiles.items(), key=lambda item: float(item[0])))
    return view or None


def num_queue_waits(before: MetricsSnapshot | None, after: MetricsSnapshot) -> float:
    """Queue waits the server recorded between the two scrapes, over every route (0 without the series)."""
    return sum(
        _delta(count_after, _before_value(before, STAGE_LATENCY_COUNT, labels))
        for labels, count_after in after.select(STAGE_LATENCY_COUNT, stage=QUEUE_STAGE)
    )


def queue_depth_view(after: MetricsSnapshot) -> dict[str, float] | None:
    """Per lane, the requests queued, summed over the engines."""
    depths: dict[str, float] = {}
    for labels, value in after.select(QUEUE_DEPTH):
        depths[labels.get("lane", "")] = depths.get(labels.get("lane", ""), 0.0) + value
    return dict(sorted(depths.items())) or None


def cache_view(before: MetricsSnapshot | None, after: MetricsSnapshot) -> dict[str, Any] | None:
    """Per modality: event deltas and hit ratio; plus the ratio over all modalities."""
    samples = after.select(CACHE_EVENTS)
    if not samples:
        return None
    events_by_modality: dict[str, dict[str, float]] = {}
    for labels, value in samples:
        modality = labels.get("modality", "")
        event = labels.get("event", "")
        growth = _delta(value, _before_value(before, CACHE_EVENTS, labels))
        events = events_by_modality.setdefault(modality, {})
        events[event] = events.get(event, 0.0) + growth
    by_modality: dict[str, Any] = {}
    total_hits = 0.0
    total_lookups = 0.0
    for modality in sorted(events_by_modality):
        events = events_by_modality[modality]
        lookups = sum(events.get(event, 0.0) for event in _LOOKUP_EVENTS)
        hits = events.get("hit", 0.0)
        total_hits += hits
        total_lookups += lookups
        by_modality[modality] = {
            "events": dict(sorted(events.items())),
            "hit_ratio": hits / lookups if lookups > 0 else None,
        }
    return {
        "by_modality": by_modality,
        "hit_ratio": total_hits / total_lookups if total_lookups > 0 else None,
    }


def server_view(before: ScrapeResult, after: ScrapeResult) -> dict[str, Any]:
    """The report's ``server`` section; every part is ``None`` when its series are absent.

    Run deltas need both scrapes; with only the one after the run, just the
    queue depth (a gauge) is reported.
    """
    errors = [error for error in (before.error, after.error) if error is not None]
    view: dict[str, Any] = {
        "scraped": before.snapshot is not None and after.snapshot is not None,
        "errors": errors,
        "batch_size": None,
        "queue_wait": None,
        "queue_depth": None,
        "cache": None,
    }
    if after.snapshot is None:
        return view
    view["queue_depth"] = queue_depth_view(after.snapshot)
    if before.snapshot is None:
        # Without a baseline the counters hold the server's whole life, not this run.
        return view
    view["batch_size"] = batch_size_view(before.snapshot, after.snapshot)
    view["queue_wait"] = queue_wait_view(before.snapshot, after.snapshot)
    view["cache"] = cache_view(before.snapshot, after.snapshot)
    return view
