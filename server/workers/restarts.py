"""The restart counters: the supervisor counts, every API process exports.

    mmserve_api_worker_restarts_total   API processes started again after they died
    mmserve_engine_restarts_total       engines started again after they died (any of the N)

The supervisor writes each count to its own file in the server's run directory
(written whole, then renamed into place); each API process reads them when
``/metrics`` is collected, so the series are the same whichever process
answers, and 0 from the start. Each counts every process started again,
whatever killed the one before (the supervisor waits before each,
``server.workers.restart_backoff``). A single-process server
(``--api-workers 1``, one engine) exports both too, at 0, beside
``mmserve_api_workers_live`` at 1 (``server.workers.readiness``): a dashboard
or alert on the series reads the same whatever the deployment runs.
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

API_WORKER_RESTARTS = "mmserve_api_worker_restarts"  # the counter's family name; samples end in _total
ENGINE_RESTARTS = "mmserve_engine_restarts"


def _write_count(run_directory: str, file_name: str, count: int) -> None:
    path = Path(run_directory) / file_name
    staging = path.with_suffix(".writing")
    staging.write_text(str(count))
    os.replace(staging, path)


def _read_count(run_directory: str, file_name: str) -> int:
    try:
        return int((Path(run_directory) / file_name).read_text())
    except (FileNotFoundError, ValueError):
        return 0


def write_restart_count(run_directory: str, count: int) -> None:
    """The API processes started again so far (the supervisor, after each)."""
    _write_count(run_directory, COUNT_FILE, count)


def read_restart_count(run_directory: str) -> int:
    return _read_count(run_directory, COUNT_FILE)


def write_engine_restart_count(run_directory: str, count: int) -> None:
    """The engines started again so far, all engines together (the supervisor, after each)."""
    _write_count(run_directory, ENGINE_COUNT_FILE, count)


def read_engine_restart_count(run_directory: str) -> int:
    return _read_count(run_directory, ENGINE_COUNT_FILE)


class _RestartCount:
    """One counter read from its file at scrape time (0 without a run directory: a single-process server)."""

    def __init__(self, run_directory: str | None, file_name: str, name: str, documentation: str) -> None:
        self._run_directory = run_directory
        self._file_name = file_name
        self._name = name
        self._documentation = documentation

    def collect(self) -> Iterator[CounterMetricFamily]:
        count = _read_count(self._run_directory, self._file_name) if self._run_directory is not None else 0
        yield CounterMetricFamily(self._name, self._documentation, value=count)


def _api_worker_restarts(run_directory: str | None) -> _RestartCount:
    return _RestartCount(run_directory, COUNT_FILE, API_WORKER_RESTARTS,
                         "API processes the supervisor started again after they died.")


def _engine_restarts(run_directory: str | None) -> _RestartCount:
    return _RestartCount(run_directory, ENGINE_COUNT_FILE, ENGINE_RESTARTS,
                         "Engines the supervisor started again after they died (all engines together).")


def register_restart_count(registry: CollectorRegistry, run_directory: str) -> None:
    """``mmserve_api_worker_restarts_total`` read from ``run_directory``."""
    registry.register(_api_worker_restarts(run_directory))


def register_engine_restart_count(registry: CollectorRegistry, run_directory: str) -> None:
    """``mmserve_engine_restarts_total`` read from ``run_directory``."""
    registry.register(_engine_restarts(run_directory))


def register_single_process_worker_series(registry: CollectorRegistry) -> None:
    """Both restart counts at 0 and the live API processes at 1, for a server that is one process."""
    registry.register(_api_worker_restarts(None))
    registry.register(_engine_restarts(None))
    register_single_process_live_worker(registry)
