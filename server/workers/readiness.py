"""Which API processes serve now: each one's marks in the run directory, and ``mmserve_api_workers_live``.

Each API process keeps two marks, files in the run directory named by its pid:

    ready/<pid>   while it can answer inference: an engine connected and ready, not draining
                  (the supervisor's "was it ever ready", ``is_marked``)
    live/<pid>    from its first ready moment until it drains or exits, whatever the engines do
                  meanwhile: an engine starting again is not an API process gone

The supervisor removes both marks of a process it reaped (``forget``), so a
killed process stops counting within one supervisor poll.

``/health/ready`` of an API process is 200 while it serves itself
(``server.workers.engine_router``): a probe that reaches a process, reaches
one that can answer, and the API processes share one listening socket, so a
restarting one takes no connection before it is up. One API process starting
again therefore leaves the server ready, with less capacity; the gauge
``mmserve_api_workers_live`` (the live marks of running processes, counted
at scrape time) is where that shows: below ``--api-workers`` while a process
starts again, and only then; an engine's outage shows in
``mmserve_engine_restarts_total`` and ``/health/ready``, not here. A
single-process server exports it at 1, so a dashboard reads the same
whatever N a deployment runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

READY_DIRECTORY = "ready"
LIVE_DIRECTORY = "live"
LIVE_GAUGE = "mmserve_api_workers_live"


class ReadyMarks:
    def __init__(self, run_directory: str) -> None:
        directories = [Path(run_directory) / name for name in (READY_DIRECTORY, LIVE_DIRECTORY)]
        for directory in directories:
            directory.mkdir(exist_ok=True)
        self._own, self._live = (directory / str(os.getpid()) for directory in directories)
        self._is_live = False

    def mark(self, is_serving: bool) -> None:
        """The ready mark follows ``is_serving`` (cheap when unchanged); the first ready moment marks it live."""
        if is_serving and not self._own.exists():
            self._own.touch()
        elif not is_serving and self._own.exists():
            self._own.unlink(missing_ok=True)
        if is_serving and not self._is_live:
            self._live.touch()
            self._is_live = True

    def leave(self) -> None:
        """Draining or exiting: neither ready nor live from now on."""
        self.mark(False)
        self._live.unlink(missing_ok=True)
        self._is_live = True  # never marked live again: a draining process does not come back


def num_live(run_directory: str) -> int:
    """API processes marked live that are still running."""
    try:
        return sum(1 for mark in (Path(run_directory) / LIVE_DIRECTORY).iterdir()
                   if Path(f"/proc/{mark.name}").exists())
    except FileNotFoundError:  # the server is stopping
        return 0


def is_marked(run_directory: str, pid: int) -> bool:
    return (Path(run_directory) / READY_DIRECTORY / str(pid)).exists()


def forget(run_directory: str, pid: int) -> None:
    """The marks of ``pid``, a process that is gone, removed (the supervisor calls it once it reaped the pid)."""
    for directory in (READY_DIRECTORY, LIVE_DIRECTORY):
        (Path(run_directory) / directory / str(pid)).unlink(missing_ok=True)


class _LiveWorkers:
    def __init__(self, run_directory: str | None) -> None:
        self._run_directory = run_directory

    def collect(self) -> Iterator[GaugeMetricFamily]:
        count = num_live(self._run_directory) if self._run_directory is not None else 1
        yield GaugeMetricFamily(LIVE_GAUGE, "API processes running and not draining, whatever the engines do; "
                                "below --api-workers while one starts again.", value=count)


def register_live_workers(registry: CollectorRegistry, run_directory: str) -> None:
    registry.register(_LiveWorkers(run_directory))


def register_single_process_live_worker(registry: CollectorRegistry) -> None:
    """The gauge at 1 for a server that is one process."""
    registry.register(_LiveWorkers(None))
