"""``mmserve serve --api-workers N`` (N > 1): one engine process and N API processes on one port.

    supervisor (this process)
      binds host:port once; every API process inherits the listening socket and accepts from it
      engine process      python -m server.workers.engine_process   (model, lanes, batcher, cache, monitoring)
      fork server         python -m server.workers.api_forkserver   (imports what API processes import, forks them)
      API process x N     python -m server.workers.api_process FD  (HTTP, protocols, tokenize, decode -> shared memory)

Every API process, the first N and each one started again, is forked by the
fork server and becomes this process's child (``server.workers.forked_process``),
so it serves within a fraction of a second of its start rather than after an
interpreter's imports; with ``api_process_start: spawn``, or where the fork
server cannot serve (not Linux, it died), API processes are new interpreters.

With a rate limit the supervisor also creates the table of token buckets every
API process shares (``server.workers.shared_rate_buckets``), so the limit holds
for the server, not per process, and removes it when the server stops.

Faults (exit statuses of the supervisor in brackets):
  an API process dies      started again after a wait that doubles per death of its slot (0.5 s,
                           1, 2 ... 30 s; 0.5 s again once a process ran a minute;
                           ``server.workers.restart_backoff``); its own in-flight requests are lost,
                           their connections drop; the others keep answering and the server stays
                           ready, ``mmserve_api_workers_live`` one lower meanwhile
                           (``server.workers.readiness``); every start again is counted in
                           mmserve_api_worker_restarts_total
  ... a crash loop         the 5th death of an API process within 60 s: every process is stopped
                           (the API processes drain) and the server exits [6, EXIT_API_CRASH_LOOP]
                           with one log line saying so, for systemd or Kubernetes to see
  ... one started with     the server stops [5]: its start-up fails (a setting, the engine's
      the server, before   tokenizer not rebuilt the same), and starting it again would only fail
      it was ever ready    again; a process started again that dies before it is ready counts as a
                           death above
  the engine dies          every API process is stopped and the supervisor exits non-zero (the
                           engine's status, or [4] when a signal killed it), so whatever supervises
                           it (systemd, k8s) restarts the server
  SIGTERM / SIGINT         every API process drains (readiness 503, accepted requests finish),
                           then the engine drains and stops; exit 0
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from server.runtime.startup_checks import bind_listening_socket
from server.settings import Settings
from server.workers.handoff import (
    ENGINE_SOCKET_VARIABLE,
    RATE_BUCKETS_VARIABLE,
    RUN_DIRECTORY_VARIABLE,
    SUPERVISOR_PID_VARIABLE,
    SETTINGS_VARIABLE,
    settings_json,
)
from server.workers.forked_process import ForkedProcess, ForkFailed, ForkServer, reap_strays
from server.workers.metrics_snapshots import remove_snapshot_files
from server.workers.readiness import forget, is_marked
from server.workers.restart_backoff import RestartBackoff, RestartPolicy
from server.workers.restarts import write_restart_count
from server.workers.shared_rate_buckets import SharedBucketTable

logger = logging.getLogger(__name__)

POLL_S = 0.05
EXIT_ENGINE_DIED = 4
EXIT_API_PROCESS_START_FAILED = 5
EXIT_API_CRASH_LOOP = 6  # server.workers.restart_backoff: API processes die too often to start again


ApiProcess = subprocess.Popen | ForkedProcess  # a new interpreter, or forked by the fork server


@dataclass
class _Slot:
    """One of the N API processes: the one running, or the time to start the next one (after a death)."""

    process: ApiProcess | None
    restart_at: float = 0.0
    is_first: bool = True  # started with the server (a start-up failure there stops the server)


class Supervisor:
    def __init__(self, settings: Settings, num_api_workers: int, policy: RestartPolicy = RestartPolicy(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._num_api_workers = num_api_workers
        self._policy = policy
        self._clock = clock
        self._listening = bind_listening_socket(settings.host, settings.port)  # StartupError: one line, no run dir
        self._run_directory = tempfile.mkdtemp(prefix="mmserve-")
        self._engine_socket = str(Path(self._run_directory) / "engine.sock")
        self._environment = {**os.environ, SETTINGS_VARIABLE: settings_json(settings),
                             ENGINE_SOCKET_VARIABLE: self._engine_socket,
                             RUN_DIRECTORY_VARIABLE: self._run_directory, SUPERVISOR_PID_VARIABLE: str(os.getpid())}
        self._rate_buckets = SharedBucketTable.create() if settings.rate_limit is not None else None
        if self._rate_buckets is not None:
            self._environment[RATE_BUCKETS_VARIABLE] = self._rate_buckets.path
        self._stopping = False
        self._fork_server: ForkServer | None = None
        self.num_restarts = 0

    def _start(self, module: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", module, *args], env=self._environment,
                                pass_fds=(self._listening.fileno(),))

    def _start_api_process(self) -> ApiProcess:
        if self._fork_server is not None:
            try:
                return self._fork_server.fork()
            except ForkFailed as e:
                logger.error("%s; API processes start as new interpreters from now on", e)
                self._fork_server.close()
                self._fork_server = None
        return self._start("server.workers.api_process", str(self._listening.fileno()))

    def _own_pids(self, engine: subprocess.Popen, api_processes: list[ApiProcess]) -> set[int]:
        fork_server = [self._fork_server.process.pid] if self._fork_server is not None else []
        return {engine.pid, *fork_server, *(process.pid for process in api_processes)}

    def _on_signal(self, sig: int, frame: object) -> None:
        self._stopping = True

    def run(self) -> int:
        write_restart_count(self._run_directory, 0)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        engine = self._start("server.workers.engine_process")
        if self._settings.api_process_start == "forkserver":
            self._fork_server = ForkServer.start(self._environment, self._listening.fileno())
        adopts = self._fork_server is not None  # a subreaper: orphans below it are its children to reap
        slots = [_Slot(self._start_api_process()) for _ in range(self._num_api_workers)]
        backoff = RestartBackoff(len(slots), self._policy, self._clock)

        def running() -> list[ApiProcess]:
            return [slot.process for slot in slots if slot.process is not None]

        logger.info("serving on %s:%d with %d API processes (pids %s, each %s) and the engine (pid %d)",
                    self._settings.host, self._settings.port, len(slots), [p.pid for p in running()],
                    _how_started(slots[0].process), engine.pid)
        ever_ready: set[int] = set()  # API processes seen ready
        try:
            while not self._stopping:
                time.sleep(POLL_S)
                if engine.poll() is not None:
                    logger.critical("the engine process exited with status %d: stopping the server", engine.returncode)
                    self._stop(running(), signal.SIGKILL)
                    return engine.returncode if engine.returncode > 0 else EXIT_ENGINE_DIED  # a signal: < 0
                ever_ready.update(p.pid for p in running() if is_marked(self._run_directory, p.pid))
                if adopts:
                    reap_strays(self._own_pids(engine, running()))
                for index, slot in enumerate(slots):
                    if self._stopping:
                        break
                    if slot.process is None:
                        if self._clock() >= slot.restart_at:
                            slot.process = self._start_api_process()
                            backoff.started(index)
                            self.num_restarts += 1
                            write_restart_count(self._run_directory, self.num_restarts)
                            logger.info("started API process %d in place of the one that died (%s)",
                                        slot.process.pid, _how_started(slot.process))
                        continue
                    process = slot.process
                    if process.poll() is None:
                        continue
                    self._forget(process.pid)
                    if slot.is_first and process.pid not in ever_ready:
                        logger.critical("API process %d exited with status %d before it was ever ready: its start-up "
                                        "fails (its log above says why); stopping the server", process.pid,
                                        process.returncode)
                        self._stop([p for p in running() if p is not process], signal.SIGKILL)
                        self._stop([engine], signal.SIGTERM)
                        return EXIT_API_PROCESS_START_FAILED
                    restart_at = backoff.died(index)
                    if restart_at is None:
                        logger.critical("crash loop: API processes died %d times within %.0f s (the last, pid %d, "
                                        "with status %d); stopping the server with exit status %d",
                                        self._policy.max_crashes, self._policy.crash_window_s, process.pid,
                                        process.returncode, EXIT_API_CRASH_LOOP)
                        self._stop([p for p in running() if p is not process], signal.SIGTERM)
                        self._stop([engine], signal.SIGTERM)
                        return EXIT_API_CRASH_LOOP
                    logger.error("API process %d exited with status %d: starting it again in %.1f s",
                                 process.pid, process.returncode, restart_at - self._clock())
                    slot.process, slot.restart_at, slot.is_first = None, restart_at, False
            # Drain: the API processes first (each finishes what it accepted), then the engine.
            self._stop(running(), signal.SIGTERM)
            self._stop([engine], signal.SIGTERM)
            return 0 if engine.returncode in (0, None) else engine.returncode
        finally:
            if self._fork_server is not None:
                self._fork_server.close()
            self._listening.close()
            for process in (engine, *running()):
                if process.poll() is None:
                    process.kill()
            if self._rate_buckets is not None:
                self._rate_buckets.remove()
            for process in (engine, *running()):
                process.wait()  # nobody writes to the run directory any more
            shutil.rmtree(self._run_directory, ignore_errors=True)  # the engine's socket, snapshots, restart count

    def _forget(self, pid: int) -> None:
        """What a dead API process left in the run directory: its ready mark (it no longer counts as serving),
        its metrics snapshot and request socket (no scrape waits for it)."""
        forget(self._run_directory, pid)
        remove_snapshot_files(self._run_directory, pid)

    def _stop(self, processes: list[ApiProcess], sig: int) -> None:
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


def _how_started(process: ApiProcess | None) -> str:
    return "forked by the fork server" if isinstance(process, ForkedProcess) else "a new interpreter"


def run_supervised(settings: Settings, num_api_workers: int) -> int:
    return Supervisor(settings, num_api_workers).run()
