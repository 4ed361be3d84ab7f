"""A count that slides with the digests: window (ring of sub-windows plus the current one) and baseline.

The KS noise floor needs the number of *independent* observations on each
side, and a stage's samples are not all independent: the requests of one
batch share that batch's compute time (a vision batch of 8 gives 8 equal
vision times), and their queue and total times move together with it. The
drift rule therefore counts, beside each (route, stage)'s digests, the
batches its samples came from: a sample of a request served in a batch of b
adds ``1 / b`` (``monitoring.ingest``), so a window of 400 requests served
in batches of 8 holds 50 observations, not 400. This class keeps that sum
over the same sub-windows as the digests, rotated in the same step.
"""

from __future__ import annotations

from collections import deque


class SlidingCount:
    """A float count over the sliding window and the baseline, rotated in lockstep with the digests.

    Not thread-safe: the ``Monitor`` serialises every call under its lock.

    Args:
        num_sub_windows: Sub-windows in the window, the current one included.
    """

    __slots__ = ("_current", "_closed", "_baseline")

    def __init__(self, num_sub_windows: int) -> None:
        self._current = 0.0
        self._closed: deque[float] = deque(maxlen=max(num_sub_windows - 1, 0))
        self._baseline = 0.0

    def add(self, amount: float) -> None:
        self._current += amount

    def rotate(self, num_steps: int, into_baseline: bool) -> None:
        """Close the current sub-window (into the baseline while it is learned) and slide by ``num_steps``."""
        if num_steps <= 0:
            return
        if into_baseline:
            self._baseline += self._current
        self._closed.append(self._current)
        for _ in range(min(num_steps - 1, self._closed.maxlen or 0)):
            self._closed.append(0.0)
        self._current = 0.0

    @property
    def window(self) -> float:
        return sum(self._closed) + self._current

    @property
    def baseline(self) -> float:
        return self._baseline

    def reset_baseline(self) -> None:
        self._baseline = 0.0
