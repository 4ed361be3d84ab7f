"""``mmserve serve --api-workers N`` (N > 1): one engine process and N API processes on one port.

    supervisor (this process)
      binds host:port once; every API process inherits the listening socket and accepts from it
      engine process      python -m server.workers.engine_process   (model, lanes, batcher, cache, monitoring)
      API process x N     python -m server.workers.api_process FD  (HTTP, protocols, tokenize, decode -> shared memory)

With a rate limit the supervisor also creates the table of token buckets every
API process shares (``server.workers.shared_rate_buckets``), so the limit holds
for the server, not per process, and removes it when the server stops.

Faults:
  an API process dies      started again at once (its own in-flight requests are lost, their
                           connections drop; the others keep answering), counted in
                           mmserve_api_worker_restarts_total
  ... before it was ever   the server stops, exiting non-zero: its start-up fails (a setting, the
      ready                engine's tokenizer not rebuilt the same), and starting it again would
                           only fail again, for ever, while the server looked up
  the engine dies          every API process is stopped and the supervisor exits non-zero, so
                           whatever supervises it (systemd, k8s) restarts the server
  SIGTERM / SIGINT         every API process drains (readiness 503, accepted requests finish),
                           then the engine drains and stops; exit 0
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from server.settings import Settings
from server.workers.handoff import (
    ENGINE_SOCKET_VARIABLE,
    RATE_BUCKETS_VARIABLE,
    RUN_DIRECTORY_VARIABLE,
    SUPERVISOR_PID_VARIABLE,
    SETTINGS_VARIABLE,
    settings_json,
)
from server.workers.readiness import READY_DIRECTORY
from server.workers.restarts import write_restart_count
from server.workers.shared_rate_buckets import SharedBucketTable

logger = logging.getLogger(__name__)

POLL_S = 0.05
EXIT_ENGINE_DIED = 4
EXIT_API_PROCESS_START_FAILED = 5


def bind_listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class Supervisor:
    def __init__(self, settings: Settings, num_api_workers: int) -> None:
        self._settings = settings
        self._num_api_workers = num_api_workers
        self._run_directory = tempfile.mkdtemp(prefix="mmserve-")
        self._engine_socket = str(Path(self._run_directory) / "engine.sock")
        self._listening = bind_listening_socket(settings.host, settings.port)
        self._environment = {**os.environ, SETTINGS_VARIABLE: settings_json(settings),
                             ENGINE_SOCKET_VARIABLE: self._engine_socket,
                             RUN_DIRECTORY_VARIABLE: self._run_directory, SUPERVISOR_PID_VARIABLE: str(os.getpid())}
        self._rate_buckets = SharedBucketTable.create() if settings.rate_limit is not None else None
        if self._rate_buckets is not None:
            self._environment[RATE_BUCKETS_VARIABLE] = self._rate_buckets.path
        self._stopping = False
        self.num_restarts = 0

    def _start(self, module: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", module, *args], env=self._environment,
                                pass_fds=(self._listening.fileno(),))

    def _start_api_process(self) -> subprocess.Popen:
        return self._start("server.workers.api_process", str(self._listening.fileno()))

    def _is_marked_ready(self, pid: int) -> bool:
        return (Path(self._run_directory) / READY_DIRECTORY / str(pid)).exists()

    def _on_signal(self, sig: int, frame: object) -> None:
        self._stopping = True

    def run(self) -> int:
        write_restart_count(self._run_directory, 0)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        engine = self._start("server.workers.engine_process")
        api_processes = [self._start_api_process() for _ in range(self._num_api_workers)]
        logger.info("serving on %s:%d with %d API processes (pids %s) and the engine (pid %d)",
                    self._settings.host, self._settings.port, len(api_processes),
                    [process.pid for process in api_processes], engine.pid)
        ever_ready: set[int] = set()  # API processes seen ready (a start-up failure is not restarted)
        try:
            while not self._stopping:
                time.sleep(POLL_S)
                if engine.poll() is not None:
                    logger.critical("the engine process exited with status %d: stopping the server", engine.returncode)
                    self._stop(api_processes, signal.SIGKILL)
                    return engine.returncode if engine.returncode > 0 else EXIT_ENGINE_DIED  # a signal: < 0
                ever_ready.update(process.pid for process in api_processes if self._is_marked_ready(process.pid))
                for index, process in enumerate(api_processes):
                    if process.poll() is not None and not self._stopping and process.pid not in ever_ready:
                        logger.critical("API process %d exited with status %d before it was ever ready: its start-up "
                                        "fails (its log above says why); stopping the server", process.pid,
                                        process.returncode)
                        self._stop([p for p in api_processes if p is not process], signal.SIGKILL)
                        self._stop([engine], signal.SIGTERM)
                        return EXIT_API_PROCESS_START_FAILED
                    if process.poll() is not None and not self._stopping:
                        self.num_restarts += 1
                        write_restart_count(self._run_directory, self.num_restarts)
                        logger.error("API process %d exited with status %d: starting it again",
                                     process.pid, process.returncode)
                        api_processes[index] = self._start_api_process()
            # Drain: the API processes first (each finishes what it accepted), then the engine.
            self._stop(api_processes, signal.SIGTERM)
            self._stop([engine], signal.SIGTERM)
            return 0 if engine.returncode in (0, None) else engine.returncode
        finally:
            self._listening.close()
            for process in (engine, *api_processes):
                if process.poll() is None:
                    process.kill()
            if self._rate_buckets is not None:
                self._rate_buckets.remove()
            for process in (engine, *api_processes):
                process.wait()  # nobody writes to the run directory any more
            shutil.rmtree(self._run_directory, ignore_errors=True)  # the engine's socket, snapshots, restart count

    def _stop(self, processes: list[subprocess.Popen], sig: int) -> None:
        for process in processes:
            if process.poll() is None:
                process.send_signal(sig)
        deadline = time.monotonic() + self._settings.drain_timeout_s + 10
        for process in processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def run_supervised(settings: Settings, num_api_workers: int) -> int:
    return Supervisor(settings, num_api_workers).run()
