"""``mmserve_api_worker_restarts_total``: the supervisor counts, every API process exports.

The supervisor writes the count to a file in the server's run directory
(written whole, then renamed into place); each API process reads it when
``/metrics`` is collected, so the series is the same whichever process
answers, and 0 from the start. It counts every process started again,
whatever killed the one before (the supervisor waits before each,
``server.workers.restart_backoff``). A single-process server
(``--api-workers 1``) exports it too, at 0, beside ``mmserve_api_workers_live``
at 1 (``server.workers.readiness``): a dashboard or alert on the series reads
the same whatever N a deployment runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily

from server.workers.readiness import register_single_process_live_worker

COUNT_FILE = "api_worker_restarts"
ENGINE_COUNT_FILE = "engine_restarts"


def write_restart_count(run_directory: str, count: int) -> None:
    path = Path(run_directory) / COUNT_FILE
    staging = path.with_suffix(".writing")
    staging.write_text(str(count))
    os.replace(staging, path)


def write_engine_restart_count(run_directory: str, count: int) -> None:
    """Engines the supervisor started again after they died (``mmserve_engine_restarts_total``)."""
    path = Path(run_directory) / ENGINE_COUNT_FILE
    staging = path.with_suffix(".writing")
    staging.write_text(str(count))
    os.replace(staging, path)


def read_restart_count(run_directory: str) -> int:
    try:
        return int((Path(run_directory) / COUNT_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return 0


class _RestartCount:
    def __init__(self, run_directory: str | None) -> None:
        self._run_directory = run_directory

    def collect(self) -> Iterator[CounterMetricFamily]:
        count = read_restart_count(self._run_directory) if self._run_directory is not None else 0
        yield CounterMetricFamily("mmserve_api_worker_restarts",
                                  "API processes the supervisor started again after they died.", value=count)


def register_restart_count(registry: CollectorRegistry, run_directory: str) -> None:
    registry.register(_RestartCount(run_directory))


def register_single_process_worker_series(registry: CollectorRegistry) -> None:
    """The restart count at 0 and the live API processes at 1, for a server that is one process."""
    registry.register(_RestartCount(None))
    register_single_process_live_worker(registry)
