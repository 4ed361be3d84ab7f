"""JSON-ready documents for ``GET /v1/monitoring/drift`` and ``GET /v1/monitoring/digests``.

Plain dicts of str/int/float/bool/None/list only (no NaN: an undefined number
is ``null``), so the server can return them as they are and another replica
or the fleet CLI can read them back.

Digests document::

    {"format": "mmserve.digests/1", "generated_unix_s": float,
     "window_s": float, "max_centroids": int,
     "series": [{"route": str, "stage": str,
                 "window": <digest>, "lifetime": <digest>}, ...]}

with ``<digest>`` as in ``monitoring.digest``. Latencies are in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from fastdigest import TDigest

from monitoring.attribution import Attribution
from monitoring.input_attribution import InputAttribution, InputShare
from monitoring.config import MonitorConfig
from monitoring.digest import digest_to_json
from monitoring.drift import StageVerdict
from monitoring.status import BaselinePhase, RouteBaseline, RouteDriftStatus

DIGESTS_FORMAT = "mmserve.digests/1"


def _number(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) or math.isinf(value) else float(value)


def digests_document(
    series: Iterable[tuple[str, str, TDigest, TDigest]], *, config: MonitorConfig, now_unix_s: float
) -> dict[str, Any]:
    """The digests document from ``(route, stage, window, lifetime)`` tuples."""
    return {
        "format": DIGESTS_FORMAT,
        "generated_unix_s": now_unix_s,
        "window_s": config.window_s,
        "max_centroids": config.max_centroids,
        "series": [
            {"route": route, "stage": stage, "window": digest_to_json(window), "lifetime": digest_to_json(lifetime)}
            for route, stage, window, lifetime in series
        ],
    }


def drift_document(
    *,
    statuses: Mapping[str, RouteDriftStatus],
    baselines: Mapping[str, RouteBaseline],
    config: MonitorConfig,
    phase: BaselinePhase,
    baseline_started_unix_s: float | None,
    learned_s: float,
    now_unix_s: float,
) -> dict[str, Any]:
    """The drift document: rule settings, baseline progress, and each route's state.

    ``baseline.phase`` is ``learning`` until ``baseline_s`` has passed and every
    route's baseline holds ``min_samples``; each route's ``baseline`` says how
    many samples it holds and needs (``state`` is ``learning_baseline`` until
    it is frozen).
    """
    return {
        "generated_unix_s": now_unix_s,
        "rule": {
            "threshold": config.threshold,
            "consecutive": config.consecutive,
            "min_samples": config.min_samples,
            "ks_alpha": config.ks_alpha,
            "tail_ratio": config.tail_ratio,
            "tail_quantiles": list(config.tail_quantiles),
            "window_s": config.window_s,
            "period_s": config.period_s,
        },
        "baseline": {
            "phase": phase.value,
            "started_unix_s": baseline_started_unix_s,
            "learned_s": min(learned_s, config.baseline_s),
            "baseline_s": config.baseline_s,
        },
        "routes": {route: _route_json(status, baselines.get(route), now_unix_s)
                   for route, status in sorted(statuses.items())},
    }


def _route_json(status: RouteDriftStatus, baseline: RouteBaseline | None, now_unix_s: float) -> dict[str, Any]:
    attribution = status.attribution
    return {
        "state": status.state.value,
        "baseline": None if baseline is None else {
            "frozen": baseline.is_frozen,
            "num_samples": baseline.num_samples,
            "min_samples": baseline.min_samples,
        },
        "active": status.is_active,
        "since_unix_s": status.since_unix_s,
        "for_s": max(now_unix_s - status.since_unix_s, 0.0),
        "attributed_stage": attribution.top_stage if attribution is not None else None,
        "attributed_input": _named_input_json(attribution),
        "evaluated_unix_s": status.evaluated_unix_s,
        "period_shifted": status.condition,
        "shifted_periods_in_row": status.num_shifted_in_row,
        "calm_periods_in_row": status.num_calm_in_row,
        "ks": {stage: _number(v.ks) for stage, v in sorted(status.verdicts.items())},
        "stages": {stage: _verdict_json(v) for stage, v in sorted(status.verdicts.items())},
        "attribution": _attribution_json(attribution) if attribution is not None else None,
    }


def _verdict_json(verdict: StageVerdict) -> dict[str, Any]:
    return {
        "ks": _number(verdict.ks),
        "noise_floor": _number(verdict.noise_floor),
        "num_window": verdict.num_window,
        "num_baseline": verdict.num_baseline,
        "observations_window": _number(verdict.observations_window),
        "observations_baseline": _number(verdict.observations_baseline),
        "judged": verdict.is_judged,
        "ks_shift": verdict.is_ks_shift,
        "tail_ratios": {str(q): _number(r) for q, r in verdict.tail_ratios.items()},
        "tail_shift": verdict.is_tail_shift,
    }


def _attribution_json(attribution: Attribution) -> dict[str, Any]:
    return {
        "top_stage": attribution.top_stage,
        "quantile": attribution.quantile,
        "total_shift_s": _number(attribution.total_shift_s),
        "by_ks": [{"stage": s.stage, "ks": _number(s.score)} for s in attribution.by_ks],
        "by_tail_share": [{"stage": s.stage, "share": _number(s.score)} for s in attribution.by_tail_share],
        "segments": [
            {"dimension": s.dimension, "value": s.value, "ks": _number(s.ks), "num_window": s.num_window,
             "num_baseline": s.num_baseline, "shifted": s.is_shifted}
            for s in attribution.segments
        ],
        "separating_segments": [
            {"dimension": s.dimension, "value": s.value, "ks": _number(s.ks)} for s in attribution.separating_segments
        ],
        "inputs": _inputs_json(attribution.inputs) if attribution.inputs is not None else None,
    }


def _named_input_json(attribution: Attribution | None) -> dict[str, Any] | None:
    """``{"stage", "dimension", "value", "share_growth"}`` of the named input value, if one is named."""
    if attribution is None or attribution.inputs is None or attribution.inputs.named is None:
        return None
    named = attribution.inputs.named
    return {"stage": attribution.inputs.stage, "dimension": named.dimension, "value": named.value,
            "share_growth": _number(named.share_growth)}


def _share_json(share: InputShare) -> dict[str, Any]:
    return {
        "dimension": share.dimension,
        "value": share.value,
        "share_growth": _number(share.share_growth),
        "z": _number(share.z),
        "tail_share_window": _number(share.tail_share_window),
        "tail_share_baseline": _number(share.tail_share_baseline),
        "tail_rate_window": _number(share.tail_rate_window),
        "tail_rate_baseline": _number(share.tail_rate_baseline),
        "traffic_share_window": _number(share.traffic_share_window),
        "traffic_share_baseline": _number(share.traffic_share_baseline),
        "num_window": share.num_window,
        "num_baseline": share.num_baseline,
    }


def _inputs_json(inputs: InputAttribution) -> dict[str, Any]:
    return {
        "stage": inputs.stage,
        "quantile": inputs.quantile,
        "threshold_s": _number(inputs.threshold_s),
        "num_tail_window": _number(inputs.num_tail_window),
        "num_tail_baseline": _number(inputs.num_tail_baseline),
        "named": _share_json(inputs.named) if inputs.named is not None else None,
        "values": [_share_json(share) for share in inputs.shares],
    }
