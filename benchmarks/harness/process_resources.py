"""A server's memory and open files over a run, process by process, from ``/proc``: does it leak?

``ProcessTreeSampler`` reads each process's RSS and open fds every few
seconds on a thread; a process started again mid-run is a series of its own.
A leak is a ``slope_per_minute`` that does not vanish as a run gets longer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

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


def child_pids(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (from ``/proc/<pid>/task/*/children``)."""
    children: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as listed:
                children.extend(int(child) for child in listed.read().split())
    except FileNotFoundError:
        pass
    return children


def process_label(pid: int) -> str:
    """What the process runs, from its command line: its ``-m`` module's last part, else the program's name.

    "" for a process not yet running its program (a fork before its exec: an empty command line).
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv = [part.decode(errors="replace") for part in cmdline.read().split(b"\0") if part]
    except FileNotFoundError:
        return "gone"
    if not argv:
        return ""
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1].rsplit(".", 1)[-1]
    return os.path.basename(argv[1] if len(argv) > 1 and argv[0].endswith(("python", "python3")) else argv[0])


@dataclass
class ProcessSeries:
    """One process's readings: when (seconds from the sampler's start), RSS and open fds."""

    pid: int
    label: str
    times_s: list[float] = field(default_factory=list)
    rss_bytes: list[int] = field(default_factory=list)
    num_fds: list[int] = field(default_factory=list)


class ProcessTreeSampler(PeriodicThread):
    """Reads RSS and open fds of ``pid`` and each of its children, one series per process, every ``interval_s``."""

    def __init__(self, pid: int, interval_s: float) -> None:
        super().__init__(interval_s, "process-tree-sampler", is_ticking_at_start=True)
        self.pid = pid
        self.series: dict[int, ProcessSeries] = {}
        self._started_s = time.monotonic()

    def tick(self) -> None:
        now_s = time.monotonic() - self._started_s
        for pid in (self.pid, *child_pids(self.pid)):
            try:
                rss, fds = rss_bytes(pid), num_open_fds(pid)
            except (FileNotFoundError, ProcessLookupError, RuntimeError):
                continue  # exited between the listing and the reading
            if pid not in self.series:
                self.series[pid] = ProcessSeries(pid, process_label(pid))
            readings = self.series[pid]
            if not readings.label:  # its command line was not readable yet (a fork before its exec): again
                readings.label = process_label(pid)
            readings.times_s.append(now_s)
            readings.rss_bytes.append(rss)
            readings.num_fds.append(fds)


def slope_per_minute(times_s: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against time, in units per minute; NaN under two points."""
    if len(times_s) < 2:
        return float("nan")
    slope_per_s, _ = np.polyfit(np.asarray(times_s), np.asarray(values, dtype=np.float64), 1)
    return float(slope_per_s * 60.0)
