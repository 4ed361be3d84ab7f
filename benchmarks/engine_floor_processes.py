"""The engines ``benchmarks.engine_floor`` compares, in their own processes, and what it asks them.

``start_mmserve_engine`` starts ``python -m server.workers.engine_process`` as
the supervisor does (``server.workers.supervisor``'s ``_start_engine``: the
handoff variables, this process as the supervisor, so the orphan guard is
satisfied); ``start_batcher`` the bare batcher (``benchmarks.engine_floor_batcher``).
Both are ready once their socket answers ``status`` with ready. Each one's
batches come from a short call on its own connection: mmserve's from its
``metrics`` exposition (``mmserve_batch_size{lane="text"}``'s sum and count),
the batcher's from its ``batches`` call.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.engine_floor_table import BATCHER, MMSERVE
from server.workers.engine_connection import call_engine_blocking

READY_TIMEOUT_S = 120.0


@dataclass
class EngineUnderTest:
    """One engine process: its name, socket, process and log."""

    name: str
    socket_path: str
    process: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_tail(self, num_chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-num_chars:] if self.log_path.exists() else ""


def call(socket_path: str, *message: object, timeout_s: float = 10.0) -> tuple:
    """One call on a short connection of its own: the answer's (kind, id, *fields)."""
    return call_engine_blocking(socket_path, *message, timeout_s=timeout_s)


def wait_ready(engine: EngineUnderTest, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until the engine's socket answers ``status`` with ready; its log's tail in the error if it dies first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine.process.poll() is not None:
            raise RuntimeError(f"{engine.name} exited with status {engine.process.returncode}:\n{engine.log_tail()}")
        try:
            kind, _, status = call(engine.socket_path, "status")
            if kind == "ok" and status[0]:
                return
        except (OSError, ConnectionError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{engine.name} was not ready within {timeout_s:g} s:\n{engine.log_tail()}")


def engine_environment(run_directory: Path, socket_path: str, text_ms: float, vision_ms: float) -> dict[str, str]:
    """The supervisor's handoff for engine 0 of ``mmserve serve --preset synthetic``, segment cache off."""
    from server.settings import Settings
    from server.workers.handoff import (
        ENGINE_INDEX_VARIABLE, ENGINE_SOCKET_VARIABLE, RUN_DIRECTORY_VARIABLE, SETTINGS_VARIABLE,
        SUPERVISOR_PID_VARIABLE, settings_json,
    )

    settings = Settings(preset="synthetic", synthetic_text_ms=text_ms, synthetic_vision_ms=vision_ms,
                        cache_text_bytes=0, cache_image_bytes=0)
    return {**os.environ, SETTINGS_VARIABLE: settings_json(settings), ENGINE_SOCKET_VARIABLE: socket_path,
            ENGINE_INDEX_VARIABLE: "0", RUN_DIRECTORY_VARIABLE: str(run_directory),
            SUPERVISOR_PID_VARIABLE: str(os.getpid())}


def _started(name: str, argv: list[str], environment: dict[str, str], socket_path: str,
             run_directory: Path) -> EngineUnderTest:
    log_path = run_directory / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, env=environment, stdout=log, stderr=subprocess.STDOUT)
    return EngineUnderTest(name, socket_path, process, log_path)


def start_mmserve_engine(run_directory: Path, text_ms: float, vision_ms: float) -> EngineUnderTest:
    socket_path = str(run_directory / "engine-0.sock")
    environment = engine_environment(run_directory, socket_path, text_ms, vision_ms)
    return _started(MMSERVE, [sys.executable, "-m", "server.workers.engine_process"], environment,
                    socket_path, run_directory)


def start_batcher(run_directory: Path, text_ms: float, vision_ms: float) -> EngineUnderTest:
    socket_path = str(run_directory / "batcher.sock")
    argv = [sys.executable, "-m", "benchmarks.engine_floor_batcher", "--socket", socket_path,
            "--text-ms", str(text_ms), "--vision-ms", str(vision_ms)]
    return _started(BATCHER, argv, dict(os.environ), socket_path, run_directory)


def text_batches(engine: EngineUnderTest) -> tuple[float, float]:
    """(batches, texts) the engine's text lane has run so far."""
    kind, _, answer = call(engine.socket_path, "batches" if engine.name == BATCHER else "metrics")
    if kind != "ok":
        raise RuntimeError(f"{engine.name} answered {kind}: {answer!r}")
    if engine.name == BATCHER:
        return float(answer[0]), float(answer[1])
    return batch_size_sum_count(answer[0], "text")


def batch_size_sum_count(exposition: str, lane: str) -> tuple[float, float]:
    """``mmserve_batch_size{lane=...}``'s count (batches) and sum (requests) in a Prometheus exposition."""
    values = {"count": 0.0, "sum": 0.0}
    for line in exposition.splitlines():
        for part in values:
            if line.startswith(f"mmserve_batch_size_{part}{{") and f'lane="{lane}"' in line:
                values[part] = float(line.rsplit(" ", 1)[1])
    return values["count"], values["sum"]
