"""Which requests are in the slow tail now that were not before: the named stage split by input value.

Stage attribution says *where* the time went (``decode``); this says *for
which requests* ("the slow ones were the 4K PNGs"). For the named stage:

1. the **slow threshold** is the stage's baseline quantile at q, snapped
   to the nearest histogram bin edge (within 15 %); q is each of 0.5 ...
   0.9999 that the baseline holds enough samples beyond, and the one that
   names a value with the largest growth is kept (``monitoring.attribution``):
   a shift of PNGs' median shows at 0.5, one of their last 0.01 % at 0.9999;
2. for each input value v of each dimension (``monitoring.inputs``), its
   **share of the slow tail**: ``share(v) = count above threshold of v /
   count above threshold of the whole dimension``, in the window and in the
   baseline, from the latency histograms (``monitoring.input_histograms``);
3. **growth** ``= share_window(v) - share_baseline(v)``. The value with the
   largest growth is *named* when its growth is at least
   ``input_min_share_growth`` and a two-proportion z-test puts it at least
   ``input_min_z`` standard errors from zero (34 values are tested in each
   period, at up to five quantiles, and these tests overlap: z >= 3.5 keeps
   the chance of naming one by noise to a few per cent at worst), and both
   tails hold ``tail_min_exceedances`` samples.

A slowdown of PNGs only, or a client that starts sending many more PNGs that
were always slower, both grow PNG's share. A slowdown of every request
leaves shares where they were, unless values differed in the baseline: a
value that already filled the baseline's tail cannot grow its share. So each
value also reports its **tail rate** (the fraction of its own requests above
the threshold, window and baseline) and its share of traffic: rates rising
for one value only is "PNGs got slower"; a traffic share rising with a flat
rate is "more PNGs"; every rate rising is "everything got slower".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from monitoring.config import MonitorConfig
from monitoring.input_histograms import bin_edges_s, first_slow_bin
from monitoring.inputs import DIMENSION_SLICES, VALUES


@dataclass(frozen=True)
class InputShare:
    """One input value's place in the named stage's slow tail, window against baseline.

    Attributes:
        dimension: e.g. ``image_encoding``.
        value: e.g. ``png``.
        tail_share_window: Its fraction of the window's samples above the threshold.
        tail_share_baseline: The same in the baseline.
        share_growth: ``tail_share_window - tail_share_baseline``.
        z: The growth in standard errors (two-proportion z-test; 0 when undefined).
        tail_rate_window: Fraction of its own window samples above the threshold.
        tail_rate_baseline: The same in the baseline.
        traffic_share_window: Its fraction of all window samples.
        traffic_share_baseline: Its fraction of all baseline samples.
        num_window: Its samples in the window.
        num_baseline: Its samples in the baseline.
    """

    dimension: str
    value: str
    tail_share_window: float
    tail_share_baseline: float
    share_growth: float
    z: float
    tail_rate_window: float
    tail_rate_baseline: float
    traffic_share_window: float
    traffic_share_baseline: float
    num_window: int
    num_baseline: int


@dataclass(frozen=True)
class InputAttribution:
    """The named stage's slow tail split by every input dimension.

    Attributes:
        stage: The stage split (the attribution's ``top_stage``).
        quantile: q of the slow threshold.
        threshold_s: The bin edge nearest the stage's baseline quantile at q: slower is the slow tail.
        num_tail_window: Window samples above the threshold (recorded with inputs).
        num_tail_baseline: Baseline samples above it.
        named: The value whose share grew most, when it passes the rule; else ``None``.
        shares: Every value with samples in window or baseline, in ``monitoring.inputs`` order.
    """

    stage: str
    quantile: float
    threshold_s: float
    num_tail_window: int
    num_tail_baseline: int
    named: InputShare | None
    shares: tuple[InputShare, ...]


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


def _z(tail_w: float, num_tail_w: float, tail_b: float, num_tail_b: float) -> float:
    pooled = _ratio(tail_w + tail_b, num_tail_w + num_tail_b)
    variance = pooled * (1 - pooled) * (1 / num_tail_w + 1 / num_tail_b)
    if variance <= 0:
        return 0.0
    return (tail_w / num_tail_w - tail_b / num_tail_b) / math.sqrt(variance)


def attribute_inputs(
    stage: str,
    window: np.ndarray,
    baseline: np.ndarray,
    quantile: float,
    threshold_s: float,
    config: MonitorConfig,
) -> InputAttribution:
    """Split one stage's slow tail by input value.

    Args:
        stage: The stage the counts belong to.
        window: ``(NUM_VALUES, NUM_BINS)`` counts of the window.
        baseline: The same for the baseline.
        quantile: q of the threshold (reported only).
        threshold_s: The stage's baseline quantile at q; samples in the bins from
            the edge nearest it on are the slow tail.
        config: ``tail_min_exceedances``, ``input_min_share_growth``, ``input_min_z``.
    """
    first = first_slow_bin(threshold_s)
    tail_w, tail_b = window[:, first:].sum(axis=1), baseline[:, first:].sum(axis=1)  # (V,) samples in the tail
    num_w, num_b = window.sum(axis=1), baseline.sum(axis=1)  # (V,)
    shares = []
    num_tail_w = num_tail_b = 0
    for dimension, rows in DIMENSION_SLICES.items():
        dim_tail_w, dim_tail_b = int(tail_w[rows].sum()), int(tail_b[rows].sum())
        dim_num_w, dim_num_b = int(num_w[rows].sum()), int(num_b[rows].sum())
        num_tail_w, num_tail_b = max(num_tail_w, dim_tail_w), max(num_tail_b, dim_tail_b)  # equal in every dimension
        if dim_tail_w <= 0 or dim_tail_b <= 0:
            continue
        for row in range(rows.start, rows.stop):
            if not num_w[row] and not num_b[row]:
                continue
            share_w, share_b = tail_w[row] / dim_tail_w, tail_b[row] / dim_tail_b
            shares.append(InputShare(
                dimension=dimension,
                value=VALUES[row][1],
                tail_share_window=float(share_w),
                tail_share_baseline=float(share_b),
                share_growth=float(share_w - share_b),
                z=_z(float(tail_w[row]), dim_tail_w, float(tail_b[row]), dim_tail_b),
                tail_rate_window=_ratio(float(tail_w[row]), float(num_w[row])),
                tail_rate_baseline=_ratio(float(tail_b[row]), float(num_b[row])),
                traffic_share_window=_ratio(float(num_w[row]), dim_num_w),
                traffic_share_baseline=_ratio(float(num_b[row]), dim_num_b),
                num_window=int(num_w[row]),
                num_baseline=int(num_b[row]),
            ))
    named = None
    enough = min(num_tail_w, num_tail_b) >= config.tail_min_exceedances
    candidates = [s for s in shares if s.share_growth >= config.input_min_share_growth and s.z >= config.input_min_z]
    if enough and candidates:
        named = max(candidates, key=lambda s: (s.share_growth, s.z))
    return InputAttribution(
        stage=stage,
        quantile=quantile,
        threshold_s=float(bin_edges_s()[first]),
        num_tail_window=num_tail_w,
        num_tail_baseline=num_tail_b,
        named=named,
        shares=tuple(shares),
    )
