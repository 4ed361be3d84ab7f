"""Which stage moved, and for which requests: ranking stages and splitting by segment.

Two rankings of the stages other than ``total``:

* **by KS**: each stage's own D against its baseline; finds any stage whose
  distribution changed, even one too small to matter end to end.
* **by tail share**: pick the quantile q (of 0.5 ... 0.9999, with enough
  samples beyond it) where ``total`` grew the most relative to its baseline,
  then score each stage by ``(Q_w,s(q) - Q_b,s(q)) / (Q_w,total(q) - Q_b,total(q))``.
  Quantiles are not additive, so shares need not sum to 1, but the stage
  that carries the end-to-end slowdown scores near 1 and the others near 0.

The named stage is the top of the tail-share ranking when ``total`` moved up,
otherwise the top of the KS ranking.

For the named stage, the window and baseline of each batch-size bucket and
of cache hit/miss are compared too. A segment *separates* the shift when it
is the only shifted segment of its dimension while another segment of that
dimension has traffic: "vision is slow, but only for cache misses".

When the requests' inputs were recorded too, the named stage's slow tail is
split by input value (``monitoring.input_attribution``): "the slow ones were
the 4K PNGs".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from fastdigest import TDigest

from monitoring.config import MonitorConfig
from monitoring.digest import ks_distance, quantiles_of
from monitoring.drift import TOTAL_STAGE, StageVerdict
from monitoring.input_attribution import InputAttribution, attribute_inputs
from monitoring.inputs import DIMENSION_SLICES, IMAGES

ATTRIBUTION_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99, 0.999, 0.9999)
# The input split shown when no value is named and total did not grow.
_REPORTED_QUANTILE = 0.9


@dataclass(frozen=True)
class StageScore:
    """A stage and its score in one ranking (D, or share of the total's shift)."""

    stage: str
    score: float


@dataclass(frozen=True)
class SegmentShift:
    """Window vs baseline of one segment of the named stage (e.g. ``cache``/``miss``)."""

    dimension: str
    value: str
    ks: float
    num_window: int
    num_baseline: int
    is_shifted: bool


@dataclass(frozen=True)
class Attribution:
    """The answer to "which stage moved" for one route and period.

    Attributes:
        top_stage: The named stage (``None`` when the route has no stage but ``total``).
        quantile: The quantile at which ``total`` grew most (``None`` when it did not grow).
        total_shift_s: ``Q_w,total(q) - Q_b,total(q)`` at that quantile (0 when none).
        by_ks: Stages by their own D, largest first.
        by_tail_share: Stages by share of the total's shift, largest first.
        segments: Segment comparisons of ``top_stage``.
        separating_segments: The segments that alone carry the shift in their dimension.
        inputs: ``top_stage``'s slow tail split by input value (``None`` when no
            inputs were recorded for it, or it has no baseline yet).
    """

    top_stage: str | None
    quantile: float | None
    total_shift_s: float
    by_ks: tuple[StageScore, ...]
    by_tail_share: tuple[StageScore, ...]
    segments: tuple[SegmentShift, ...]
    separating_segments: tuple[SegmentShift, ...]
    inputs: InputAttribution | None = None


DigestPair = tuple[TDigest, TDigest]
"""``(window, baseline)`` of one series."""

SegmentLookup = Callable[[str], Mapping[tuple[str, str], DigestPair]]
"""``segments_of(stage) -> {(dimension, value): (window, baseline)}``."""

InputCountsLookup = Callable[[str], "tuple[np.ndarray, np.ndarray] | None"]
"""``inputs_of(stage) -> (window, baseline)`` input-value histograms, or ``None`` when none were recorded."""


def rank_by_ks(verdicts: Mapping[str, StageVerdict]) -> tuple[StageScore, ...]:
    """Stages other than ``total`` with a defined D, largest D first."""
    scores = [StageScore(v.stage, v.ks) for v in verdicts.values() if v.stage != TOTAL_STAGE and not math.isnan(v.ks)]
    return tuple(sorted(scores, key=lambda s: (-s.score, s.stage)))


def attribution_quantile(total: DigestPair, min_exceedances: int) -> tuple[float | None, float]:
    """The quantile where ``total`` grew most (by ratio), and its growth in seconds."""
    window, baseline = total
    num = min(int(window.n_values), int(baseline.n_values))
    usable = [q for q in ATTRIBUTION_QUANTILES if num * (1 - q) >= min_exceedances]
    if not usable:
        return None, 0.0
    window_q = quantiles_of(window, usable)
    baseline_q = quantiles_of(baseline, usable)
    best_q: float | None = None
    best_ratio = 1.0
    for q, w, b in zip(usable, window_q, baseline_q):
        if b > 0 and w / b > best_ratio:
            best_q, best_ratio = q, w / b
    if best_q is None:
        return None, 0.0
    i = usable.index(best_q)
    return best_q, window_q[i] - baseline_q[i]


def rank_by_tail_share(
    stage_pairs: Mapping[str, DigestPair], quantile: float, total_shift_s: float
) -> tuple[StageScore, ...]:
    """Stages other than ``total`` by ``(Q_w(q) - Q_b(q)) / total_shift_s``, largest first."""
    scores = []
    for stage, (window, baseline) in stage_pairs.items():
        if stage == TOTAL_STAGE or window.is_empty() or baseline.is_empty():
            continue
        (w,), (b,) = quantiles_of(window, [quantile]), quantiles_of(baseline, [quantile])
        scores.append(StageScore(stage, (w - b) / total_shift_s))
    return tuple(sorted(scores, key=lambda s: (-s.score, s.stage)))


def split_segments(
    segment_pairs: Mapping[tuple[str, str], DigestPair], config: MonitorConfig
) -> tuple[tuple[SegmentShift, ...], tuple[SegmentShift, ...]]:
    """Compare each segment's window with its baseline; return all and the separating ones."""
    shifts = []
    for (dimension, value), (window, baseline) in sorted(segment_pairs.items()):
        num_window, num_baseline = int(window.n_values), int(baseline.n_values)
        if not num_window or not num_baseline:
            continue
        ks = ks_distance(window, baseline)
        is_shifted = ks > config.threshold and ks > config.ks_noise_floor(num_window, num_baseline)
        shifts.append(SegmentShift(dimension, value, ks, num_window, num_baseline, is_shifted))
    separating = []
    for dimension in sorted({s.dimension for s in shifts}):
        members = [s for s in shifts if s.dimension == dimension]
        shifted = [s for s in members if s.is_shifted]
        if len(members) >= 2 and len(shifted) == 1:
            separating.append(shifted[0])
    return tuple(shifts), tuple(separating)


def attribute(
    verdicts: Mapping[str, StageVerdict],
    stage_pairs: Mapping[str, DigestPair],
    segments_of: SegmentLookup,
    config: MonitorConfig,
    inputs_of: InputCountsLookup | None = None,
) -> Attribution:
    """Rank the stages of one route and split the named stage by segment and by input value.

    Args:
        verdicts: This period's verdict per stage.
        stage_pairs: ``(window, baseline)`` per stage, ``total`` included.
        segments_of: Returns ``{(dimension, value): (window, baseline)}`` of a stage.
        config: The drift rule's settings.
        inputs_of: Returns a stage's input-value histograms (window, baseline), if any.
    """
    by_ks = rank_by_ks(verdicts)
    quantile: float | None = None
    total_shift_s = 0.0
    by_tail_share: tuple[StageScore, ...] = ()
    total = stage_pairs.get(TOTAL_STAGE)
    if total is not None:
        quantile, total_shift_s = attribution_quantile(total, config.tail_min_exceedances)
        if quantile is not None and total_shift_s > 0:
            by_tail_share = rank_by_tail_share(stage_pairs, quantile, total_shift_s)
    if by_tail_share and by_tail_share[0].score > 0:
        top_stage: str | None = by_tail_share[0].stage
    elif by_ks:
        top_stage = by_ks[0].stage
    else:
        top_stage = None
    segments: tuple[SegmentShift, ...] = ()
    separating: tuple[SegmentShift, ...] = ()
    inputs: InputAttribution | None = None
    if top_stage is not None:
        segments, separating = split_segments(segments_of(top_stage), config)
        if inputs_of is not None:
            inputs = _split_inputs(top_stage, stage_pairs[top_stage][1], inputs_of, quantile, config)
    return Attribution(
        top_stage=top_stage,
        quantile=quantile,
        total_shift_s=total_shift_s,
        by_ks=by_ks,
        by_tail_share=by_tail_share,
        segments=segments,
        separating_segments=separating,
        inputs=inputs,
    )


def _split_inputs(stage: str, baseline: TDigest, inputs_of: InputCountsLookup, quantile: float | None,
                  config: MonitorConfig) -> InputAttribution | None:
    """The stage's slow tail by input value, at the quantile that names a value with the largest growth.

    Every quantile of ``ATTRIBUTION_QUANTILES`` whose baseline threshold has
    ``tail_min_exceedances`` samples with inputs beyond it is tried: a shift
    of the body (PNGs' median) shows at 0.5, one of the last requests at
    0.9999, and the window needs no such count (it is the side that grew).
    Without a named value the split is reported at the quantile where
    ``total`` grew most when it is one of those, else at the highest one up
    to 0.9 (higher ones may hold no window sample to show).
    """
    counts = inputs_of(stage)
    if counts is None or baseline.is_empty():
        return None
    window, baseline_counts = counts
    num_baseline = int(baseline_counts[DIMENSION_SLICES[IMAGES]].sum())  # every sample once in each dimension
    usable = [q for q in ATTRIBUTION_QUANTILES if num_baseline * (1 - q) >= config.tail_min_exceedances]
    if not usable:
        return None
    splits = {q: attribute_inputs(stage, window, baseline_counts, q, threshold_s, config)
              for q, threshold_s in zip(usable, quantiles_of(baseline, usable))}
    named = [split for split in splits.values() if split.named is not None]
    if named:
        return max(named, key=lambda split: split.named.share_growth)  # type: ignore[union-attr]
    if quantile in splits:
        return splits[quantile]
    return splits[max([q for q in usable if q <= _REPORTED_QUANTILE] or usable[:1])]
