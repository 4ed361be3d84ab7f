"""``/health/ready`` of an API process: the engine ready and every API process of the server ready.

Each API process marks itself ready with a file in the run directory (named
by its pid) once its engine connection is up and the engine is ready, and
removes it when it drains or stops. A process answering ``/health/ready``
counts the marks of processes still running: fewer than ``--api-workers``
(one was killed and is starting again) is not ready. A probe costs one
directory listing.
"""

from __future__ import annotations

import os
from pathlib import Path

READY_DIRECTORY = "ready"


class ReadyMarks:
    def __init__(self, run_directory: str, num_api_workers: int) -> None:
        self._directory = Path(run_directory) / READY_DIRECTORY
        self._directory.mkdir(exist_ok=True)
        self._num_api_workers = num_api_workers
        self._own = self._directory / str(os.getpid())

    def mark(self, is_ready: bool) -> None:
        """This process's mark follows ``is_ready`` (cheap when unchanged)."""
        if is_ready and not self._own.exists():
            self._own.touch()
        elif not is_ready and self._own.exists():
            self._own.unlink(missing_ok=True)

    def all_ready(self) -> bool:
        live = sum(1 for mark in self._directory.iterdir() if Path(f"/proc/{mark.name}").exists())
        return live >= self._num_api_workers
