"""How sure a mean of a few runs is: its 95 % confidence interval (Student's t).

A benchmark on a shared machine repeats a comparison and pools the ratios;
the interval says how many repeats a claim needs. It assumes the values are
independent, which runs back to back on one machine are not quite, so it is
a guide, not a test.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

# Student's t, two-sided 95 %, for 1..30 degrees of freedom (the last stands for more).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its 95 % confidence interval; one value has none (NaN bounds)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half_width = T_975[min(len(values) - 1, len(T_975)) - 1] * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half_width, mean + half_width
