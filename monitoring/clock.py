"""The clocks the monitor reads time from.

All time in this package goes through a ``Clock`` so that tests and the drift
benchmark run on a simulated clock: an hour of traffic takes seconds, and a
test says exactly in which period a shift starts. Two readings are needed:
a monotonic one for windows and periods (immune to NTP steps) and a wall one
for the "since when" that humans read in the drift view.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Source of time for windows, periods and timestamps."""

    def monotonic_s(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...

    def unix_s(self) -> float:
        """Seconds since the Unix epoch, for timestamps shown to people."""
        ...


class SystemClock:
    """The process clocks: ``time.monotonic`` and ``time.time``."""

    def monotonic_s(self) -> float:
        return time.monotonic()

    def unix_s(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to; for tests and simulations.

    Args:
        start_unix_s: The wall time that corresponds to monotonic time 0.
    """

    def __init__(self, start_unix_s: float = 1_700_000_000.0) -> None:
        self._now_s = 0.0
        self._start_unix_s = start_unix_s

    def monotonic_s(self) -> float:
        return self._now_s

    def unix_s(self) -> float:
        return self._start_unix_s + self._now_s

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (must not be negative)."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards (advance by {seconds} s)")
        self._now_s += seconds
