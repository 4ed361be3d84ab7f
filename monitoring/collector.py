"""Prometheus export of the digests and the drift state, computed at scrape time.

A custom collector (``prometheus_client.registry.Collector``): nothing is
updated per request; each scrape asks the monitor for a snapshot and turns it
into metric families.

``mmserve_stage_latency_seconds{route,stage,quantile}`` is a summary whose
**quantiles come from the sliding window** and whose **_sum and _count come
from the lifetime digest**. Quantiles over the window answer "how slow is it
now": a lifetime P99.99 after a week of traffic would hardly move during an
incident, so an SLO alert on it would never fire. ``_sum`` and ``_count`` are
counters and must only go up (``rate()`` relies on it), which a window's sum
would not. This is also how Prometheus' own summaries behave (quantiles over a
sliding max-age window, cumulative sum and count). A P99.99 needs about 10^5
samples in the window to be more than the window's largest sample; fleet-wide
or long-range tails come from merging the digests (``monitoring.fleet``), not
from averaging these quantiles, which cannot be aggregated.

``mmserve_drift_attributed`` carries two label sets while drift is active:
``{route, stage}`` for the named stage (as before input attribution existed)
and ``{route, stage, dimension, value}`` for the input value named in that
stage's slow tail, when one is. Select ``{dimension=""}`` for the first.
``mmserve_drift_tail_share_growth{route, stage, dimension, value}`` is every
input value's share growth in the named stage's slow tail after each judged
period (at most 34 series a route: the values are fixed).

``mmserve_drift_baseline_samples{route}``, ``mmserve_drift_baseline_min_samples{route}``
and ``mmserve_drift_baseline_frozen{route}`` are each route's baseline progress
(``Monitor.baselines()``, the ``baseline`` object of ``GET /v1/monitoring/drift``):
a route is judged only once its baseline is frozen, which needs ``baseline_s``
*and* ``min_samples``, so an idle route can learn for hours; the ratio of the
first two graphs how far it is, and ``frozen == 0`` long after start alerts on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from monitoring.status import ExportSnapshot

SUMMARY_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99, 0.999, 0.9999)

STAGE_LATENCY = "mmserve_stage_latency_seconds"
DRIFT_KS = "mmserve_drift_ks_statistic"
DRIFT_ACTIVE = "mmserve_drift_active"
DRIFT_ATTRIBUTED = "mmserve_drift_attributed"
DRIFT_TAIL_SHARE_GROWTH = "mmserve_drift_tail_share_growth"
DRIFT_BASELINE_SAMPLES = "mmserve_drift_baseline_samples"
DRIFT_BASELINE_MIN_SAMPLES = "mmserve_drift_baseline_min_samples"
DRIFT_BASELINE_FROZEN = "mmserve_drift_baseline_frozen"
DROPPED_RECORDS = "mmserve_monitor_dropped_records"
INVALID_RECORDS = "mmserve_monitor_invalid_records"


class MonitorCollector(Collector):
    """Exports a monitor's snapshot on every scrape.

    Args:
        snapshot: Returns the current ``ExportSnapshot`` (``Monitor.export_snapshot``).
    """

    def __init__(self, snapshot: Callable[[], ExportSnapshot]) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterator[Metric]:
        """The families without samples, so registering never runs a scrape."""
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        yield from self._families(self._snapshot())

    @staticmethod
    def _families(snapshot: ExportSnapshot | None = None) -> Iterator[Metric]:
        latency = SummaryMetricFamily(
            STAGE_LATENCY,
            "Stage latency from T-Digests: quantiles over the sliding window, sum and count over the lifetime.",
            labels=("route", "stage"),
        )
        ks = GaugeMetricFamily(
            DRIFT_KS,
            "KS statistic D between the stage's latency window and its frozen baseline (latest period).",
            labels=("route", "stage"),
        )
        active = GaugeMetricFamily(DRIFT_ACTIVE, "1 while latency drift is active on the route.", labels=("route",))
        attributed = GaugeMetricFamily(
            DRIFT_ATTRIBUTED,
            "1 for the stage named as the cause while drift is active on the route; with dimension and value, "
            "1 for the input value whose share of that stage's slow tail grew most.",
            labels=("route", "stage"),
        )
        growth = GaugeMetricFamily(
            DRIFT_TAIL_SHARE_GROWTH,
            "Share of the attributed stage's slow tail held by each input value, window minus baseline "
            "(latest period).",
            labels=("route", "stage", "dimension", "value"),
        )
        baseline_samples = GaugeMetricFamily(
            DRIFT_BASELINE_SAMPLES,
            "Samples the route's drift baseline holds (its total stage), learned or frozen.",
            labels=("route",),
        )
        baseline_min_samples = GaugeMetricFamily(
            DRIFT_BASELINE_MIN_SAMPLES,
            "Samples the route's drift baseline must hold before it is frozen (drift_min_samples).",
            labels=("route",),
        )
        baseline_frozen = GaugeMetricFamily(
            DRIFT_BASELINE_FROZEN,
            "1 once the route's drift baseline is frozen and the route judged; 0 while it still learns.",
            labels=("route",),
        )
        dropped = CounterMetricFamily(
            DROPPED_RECORDS, "Latency records dropped because the monitor's buffer was full."
        )
        invalid = CounterMetricFamily(INVALID_RECORDS, "Latency records skipped for non-numeric or negative times.")
        if snapshot is not None:
            for stage in snapshot.stages:
                labels = {"route": stage.route, "stage": stage.stage}
                for q, value_s in zip(snapshot.quantiles, stage.quantiles_s):
                    latency.samples.append(Sample(STAGE_LATENCY, {**labels, "quantile": str(q)}, value_s))
                latency.add_metric([stage.route, stage.stage], stage.count, stage.sum_s)
            for status in snapshot.routes:
                active.add_metric([status.route], 1.0 if status.is_active else 0.0)
                for verdict in status.verdicts.values():
                    if not math.isnan(verdict.ks):
                        ks.add_metric([status.route, verdict.stage], verdict.ks)
                attribution = status.attribution
                if attribution is None:
                    continue
                if status.is_active and attribution.top_stage:
                    attributed.add_metric([status.route, attribution.top_stage], 1.0)
                inputs = attribution.inputs
                if inputs is None:
                    continue
                for share in inputs.shares:
                    growth.add_metric([status.route, inputs.stage, share.dimension, share.value], share.share_growth)
                if status.is_active and inputs.named is not None:
                    labels = {"route": status.route, "stage": inputs.stage, "dimension": inputs.named.dimension,
                              "value": inputs.named.value}
                    attributed.samples.append(Sample(DRIFT_ATTRIBUTED, labels, 1.0))
            for baseline in snapshot.baselines:
                baseline_samples.add_metric([baseline.route], baseline.num_samples)
                baseline_min_samples.add_metric([baseline.route], baseline.min_samples)
                baseline_frozen.add_metric([baseline.route], 1.0 if baseline.is_frozen else 0.0)
            dropped.add_metric([], snapshot.num_dropped_records)
            invalid.add_metric([], snapshot.num_invalid_records)
        yield from (latency, ks, active, attributed, growth, baseline_samples, baseline_min_samples, baseline_frozen,
                    dropped, invalid)
