"""Figures read from a run's samples: answers per second, latency percentiles, the generator's lag.

Latency is from the intended send time by default (an open loop's honest
figure), or from the actual send time (what the server's deadlines count).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from benchmarks.loadgen.runner import Sample


def percentile_ms(values_s: Sequence[float], percentile: float) -> float:
    """A percentile of durations in seconds, in milliseconds; NaN when there are none."""
    return float(np.percentile(values_s, percentile) * 1000) if len(values_s) else float("nan")


def ok_rate_rps(samples: Sequence[Sample]) -> float:
    """Answered (ok) requests per second over the run's span: first intended send to last answer."""
    num_ok = sum(sample.is_ok for sample in samples)
    span_s = max(sample.done_s for sample in samples) - min(sample.intended_s for sample in samples)
    return num_ok / span_s


def latency_ms(samples: Sequence[Sample], percentile: float, *, from_sent: bool = False) -> float:
    """A percentile of answered requests' latency: from the intended send time, or (``from_sent``) the actual one."""
    return percentile_ms([sample.done_s - sample.sent_s if from_sent else sample.latency_s
                          for sample in samples if sample.is_ok and (sample.sent_s is not None or not from_sent)],
                         percentile)


def lag_p99_ms(samples: Sequence[Sample]) -> float:
    """How far behind its schedule the generator sent (p99)."""
    return percentile_ms([sample.lag_s for sample in samples if sample.lag_s is not None], 99)
