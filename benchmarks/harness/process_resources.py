"""A server process's memory and open files over a run, from ``/proc``: does it leak?

``ResourceSampler`` reads the resident set (``VmRSS`` in
``/proc/<pid>/status``) and the open file descriptors (``/proc/<pid>/fd``)
every few seconds on a thread of its own; ``slope_per_minute`` is the
least-squares trend of such a series. A leak shows as a slope that does not
vanish as a run gets longer. Linux only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np

from benchmarks.harness.periodic_thread import PeriodicThread


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS")


def num_open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class ResourceSampler(PeriodicThread):
    """Reads RSS and open fds of ``pid`` every ``interval_s`` on a thread, from the block's start until its end."""

    def __init__(self, pid: int, interval_s: float) -> None:
        super().__init__(interval_s, "resource-sampler", is_ticking_at_start=True)
        self.pid = pid
        self.times_s: list[float] = []
        self.rss_bytes: list[int] = []
        self.num_fds: list[int] = []
        self._started_s = time.monotonic()

    def tick(self) -> None:
        self.times_s.append(time.monotonic() - self._started_s)
        self.rss_bytes.append(rss_bytes(self.pid))
        self.num_fds.append(num_open_fds(self.pid))


def slope_per_minute(times_s: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against time, in units per minute; NaN under two points."""
    if len(times_s) < 2:
        return float("nan")
    slope_per_s, _ = np.polyfit(np.asarray(times_s), np.asarray(values, dtype=np.float64), 1)
    return float(slope_per_s * 60.0)
