"""Which API processes serve now: each one's mark in the run directory, and ``mmserve_api_workers_live``.

Each API process marks itself serving with a file in the run directory
(named by its pid) while its engine connection is up, the engine is ready
and it is not draining, and removes it when that stops; the supervisor
removes the mark of a process it reaped (``forget``), so a killed process
stops counting within one supervisor poll.

``/health/ready`` of an API process is 200 while it serves itself
(``server.workers.engine_router``): a probe that reaches a process, reaches
one that can answer, and the API processes share one listening socket, so a
restarting one takes no connection before it is up. One API process starting
again therefore leaves the server ready, with less capacity; the gauge
``mmserve_api_workers_live`` (the marks of running processes, counted at
scrape time) is where that shows: below ``--api-workers`` while a process
starts again. A single-process server exports it at 1, so a dashboard reads
the same whatever N a deployment runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

READY_DIRECTORY = "ready"
LIVE_GAUGE = "mmserve_api_workers_live"


class ReadyMarks:
    def __init__(self, run_directory: str) -> None:
        self._directory = Path(run_directory) / READY_DIRECTORY
        self._directory.mkdir(exist_ok=True)
        self._own = self._directory / str(os.getpid())

    def mark(self, is_serving: bool) -> None:
        """This process's mark follows ``is_serving`` (cheap when unchanged)."""
        if is_serving and not self._own.exists():
            self._own.touch()
        elif not is_serving and self._own.exists():
            self._own.unlink(missing_ok=True)


def num_serving(run_directory: str) -> int:
    """API processes marked serving that are still running."""
    try:
        return sum(1 for mark in (Path(run_directory) / READY_DIRECTORY).iterdir()
                   if Path(f"/proc/{mark.name}").exists())
    except FileNotFoundError:  # the server is stopping
        return 0


def is_marked(run_directory: str, pid: int) -> bool:
    return (Path(run_directory) / READY_DIRECTORY / str(pid)).exists()


def forget(run_directory: str, pid: int) -> None:
    """The mark of ``pid``, a process that is gone, removed (the supervisor calls it once it reaped the pid)."""
    (Path(run_directory) / READY_DIRECTORY / str(pid)).unlink(missing_ok=True)


class _LiveWorkers:
    def __init__(self, run_directory: str | None) -> None:
        self._run_directory = run_directory

    def collect(self) -> Iterator[GaugeMetricFamily]:
        count = num_serving(self._run_directory) if self._run_directory is not None else 1
        yield GaugeMetricFamily(LIVE_GAUGE, "API processes serving now (engine ready, not draining); below "
                                "--api-workers while one starts again, the server still ready.", value=count)


def register_live_workers(registry: CollectorRegistry, run_directory: str) -> None:
    registry.register(_LiveWorkers(run_directory))


def register_single_process_live_worker(registry: CollectorRegistry) -> None:
    """The gauge at 1 for a server that is one process."""
    registry.register(_LiveWorkers(None))
