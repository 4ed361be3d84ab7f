"""``mmserve serve --api-workers N`` (N > 1) or ``--engines E`` (E > 1): E engines and N API processes on one port.

    supervisor (this process)
      binds host:port once; every API process inherits the listening socket and accepts from it
      engine process x E  python -m server.workers.engine_process   (model, lanes, batcher, cache; engine 0
                          also the one monitor), engine i on <run directory>/engine-<i>.sock with its own
                          settings (device, compute threads: ``server.workers.engine_plan``)
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
  an engine dies           started again with the same backoff as an API process (its own slots);
                           only the requests it held fail (503 engine_unavailable, retriable), the
                           other engines take the rest (``server.workers.engine_dispatch``) and the
                           server stays ready while one engine serves; with one engine the server
                           answers 503 engine_unavailable and is not ready until it is back; every
                           start again is counted in mmserve_engine_restarts_total
  ... a crash loop         the 5th death of an engine within 60 s: every process is stopped and the
                           server exits [7, EXIT_ENGINE_CRASH_LOOP], for systemd or Kubernetes to see
  ... one started with     the server stops with the engine's status ([4] when a signal killed it): its
      the server, before   model does not load, and starting it again would only fail again; for a
      it ever listened     setting the machine cannot meet (the engine exits [2] and says which,
                           ``server.workers.start_failure``) that one line is raised as a
                           ``StartupError``: ``mmserve serve`` prints it last and exits [2], as one
                           process does
  SIGTERM / SIGINT         every API process drains (readiness 503, accepted requests finish),
                           then the engine drains and stops; exit 0
  SIGINT to the group      the same (Ctrl+C in a terminal signals the whole foreground group): the
                           API processes and engines ignore SIGINT and are stopped by the supervisor,
                           in the order above, with SIGTERM
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

from server.runtime.startup_checks import (ListenerPortError, StartupError, bind_listening_socket, check_other_ports,
                                           listen_on_metrics_port)
from server.settings import Settings
from server.workers.engine_plan import EnginePlan, engine_plans
from server.workers.handoff import (
    ENGINE_INDEX_VARIABLE,
    ENGINE_SOCKET_VARIABLE,
    ENGINE_SOCKETS_VARIABLE,
    METRICS_FD_VARIABLE,
    RATE_BUCKETS_VARIABLE,
    RUN_DIRECTORY_VARIABLE,
    SUPERVISOR_PID_VARIABLE,
    SETTINGS_VARIABLE,
    STARTED_UNIX_S_VARIABLE,
    settings_json,
)
from server.workers.forked_process import ForkedProcess, ForkFailed, ForkServer, reap_strays
from server.workers.metrics_snapshots import remove_request_socket
from server.workers.pixel_slots import block_prefix, remove_blocks
from server.workers.readiness import forget, is_marked
from server.workers.restart_backoff import RestartBackoff, RestartPolicy
from server.workers.restarts import write_engine_restart_count, write_restart_count
from server.workers.shared_rate_buckets import SharedBucketTable
from server.workers.start_failure import (EXIT_CONFIGURATION_ERROR, api_process_name, engine_name,
                                          read_start_failure)

logger = logging.getLogger(__name__)

POLL_S = 0.05
EXIT_ENGINE_DIED = 4
EXIT_API_PROCESS_START_FAILED = 5
EXIT_API_CRASH_LOOP = 6  # server.workers.restart_backoff: API processes die too often to start again
EXIT_ENGINE_CRASH_LOOP = 7  # engines die too often to start again


ApiProcess = subprocess.Popen | ForkedProcess  # a new interpreter, or forked by the fork server


@dataclass
class _Slot:
    """One of the N API processes: the one running, or the time to start the next one (after a death)."""

    process: ApiProcess | None
    restart_at: float = 0.0
    is_first: bool = True  # started with the server (a start-up failure there stops the server)


@dataclass
class _EngineSlot:
    """One engine: the process running, or the time to start it again (after a death)."""

    plan: EnginePlan
    socket_path: str
    process: subprocess.Popen | None = None
    restart_at: float = 0.0
    has_listened: bool = False  # its model loaded once: a death after this is started again

    def listens(self) -> bool:
        return Path(self.socket_path).exists()


class Supervisor:
    def __init__(self, settings: Settings, num_api_workers: int, policy: RestartPolicy = RestartPolicy(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._num_api_workers = num_api_workers
        self._policy = policy
        self._clock = clock
        self._listening = bind_listening_socket(settings.host, settings.port)  # StartupError: one line, no run dir
        try:
            check_other_ports(settings)  # the API processes' gRPC and the ops port: taken ones fail here, in a second
            # The metrics port, bound once here and served by every API process (the engines serve none).
            self._metrics = listen_on_metrics_port(settings) if settings.metrics_port is not None else None
        except (StartupError, ListenerPortError):
            self._listening.close()
            raise
        self._inherited_fds = (self._listening.fileno(), *([self._metrics.fileno()] if self._metrics else []))
        self._run_directory = tempfile.mkdtemp(prefix="mmserve-")
        self._engines = [_EngineSlot(plan, str(Path(self._run_directory) / f"engine-{plan.index}.sock"))
                         for plan in engine_plans(settings)]
        self._environment = {**os.environ, SETTINGS_VARIABLE: settings_json(settings),
                             ENGINE_SOCKETS_VARIABLE: os.pathsep.join(slot.socket_path for slot in self._engines),
                             RUN_DIRECTORY_VARIABLE: self._run_directory, SUPERVISOR_PID_VARIABLE: str(os.getpid()),
                             STARTED_UNIX_S_VARIABLE: str(int(time.time()))}
        if self._metrics is not None:
            self._environment[METRICS_FD_VARIABLE] = str(self._metrics.fileno())
        self._rate_buckets = SharedBucketTable.create() if settings.rate_limit is not None else None
        if self._rate_buckets is not None:
            self._environment[RATE_BUCKETS_VARIABLE] = self._rate_buckets.path
        self._stopping = False
        self._fork_server: ForkServer | None = None
        self.num_restarts = 0
        self.num_engine_restarts = 0

    def _start(self, module: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", module, *args], env=self._environment,
                                pass_fds=self._inherited_fds)

    def _start_engine(self, slot: _EngineSlot) -> None:
        """Engine ``slot.plan.index``: its own settings, socket and GPU; no listening socket (it serves none)."""
        Path(slot.socket_path).unlink(missing_ok=True)  # a dead engine's: the new one listens when it is loaded
        environment = {**self._environment, **slot.plan.environment,
                       SETTINGS_VARIABLE: settings_json(slot.plan.settings), ENGINE_SOCKET_VARIABLE: slot.socket_path,
                       ENGINE_INDEX_VARIABLE: str(slot.plan.index)}
        slot.process = subprocess.Popen([sys.executable, "-m", "server.workers.engine_process"], env=environment)

    def _engine_processes(self) -> list[subprocess.Popen]:
        return [slot.process for slot in self._engines if slot.process is not None]

    def _start_api_process(self) -> ApiProcess:
        if self._fork_server is not None:
            try:
                return self._fork_server.fork()
            except ForkFailed as e:
                logger.error("%s; API processes start as new interpreters from now on", e)
                self._fork_server.close()
                self._fork_server = None
        return self._start("server.workers.api_process", str(self._listening.fileno()))

    def _own_pids(self, api_processes: list[ApiProcess]) -> set[int]:
        fork_server = [self._fork_server.process.pid] if self._fork_server is not None else []
        return {*(engine.pid for engine in self._engine_processes()), *fork_server,
                *(process.pid for process in api_processes)}

    def _on_signal(self, sig: int, frame: object) -> None:
        self._stopping = True

    def run(self) -> int:
        write_restart_count(self._run_directory, 0)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        write_engine_restart_count(self._run_directory, 0)
        for engine_slot in self._engines:
            self._start_engine(engine_slot)
        engine_backoff = RestartBackoff(len(self._engines), self._policy, self._clock)
        if self._settings.api_process_start == "forkserver":
            self._fork_server = ForkServer.start(self._environment, self._listening.fileno(), self._inherited_fds[1:])
        adopts = self._fork_server is not None  # a subreaper: orphans below it are its children to reap
        slots = [_Slot(self._start_api_process()) for _ in range(self._num_api_workers)]
        backoff = RestartBackoff(len(slots), self._policy, self._clock)

        def running() -> list[ApiProcess]:
            return [slot.process for slot in slots if slot.process is not None]

        logger.info("listening on %s:%d; starting %d API processes (pids %s, each %s) and %d engines (pids %s)",
                    self._settings.host, self._settings.port, len(slots), [p.pid for p in running()],
                    _how_started(slots[0].process), len(self._engines), [p.pid for p in self._engine_processes()])
        ever_ready: set[int] = set()  # API processes seen ready
        try:
            while not self._stopping:
                time.sleep(POLL_S)
                exit_code = self._watch_engines(engine_backoff, running)
                if exit_code is not None:
                    return exit_code
                ever_ready.update(p.pid for p in running() if is_marked(self._run_directory, p.pid))
                if adopts:
                    reap_strays(self._own_pids(running()))
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
                        reason = read_start_failure(self._run_directory, api_process_name(process.pid))
                        if process.returncode == EXIT_CONFIGURATION_ERROR and reason is not None:
                            self._stop_all([p for p in running() if p is not process], EXIT_CONFIGURATION_ERROR)
                            raise StartupError(reason)  # a setting (a --grpc-port taken since it was checked)
                        logger.critical("API process %d exited with status %d before it was ever ready: its start-up "
                                        "fails (its log above says why); stopping the server", process.pid,
                                        process.returncode)
                        self._stop([p for p in running() if p is not process], signal.SIGKILL)
                        self._stop(self._engine_processes(), signal.SIGTERM)
                        return EXIT_API_PROCESS_START_FAILED
                    restart_at = backoff.died(index)
                    if restart_at is None:
                        logger.critical("crash loop: API processes died %d times within %.0f s (the last, pid %d, "
                                        "with status %d); stopping the server with exit status %d",
                                        self._policy.max_crashes, self._policy.crash_window_s, process.pid,
                                        process.returncode, EXIT_API_CRASH_LOOP)
                        self._stop([p for p in running() if p is not process], signal.SIGTERM)
                        self._stop(self._engine_processes(), signal.SIGTERM)
                        return EXIT_API_CRASH_LOOP
                    logger.error("API process %d exited with status %d: starting it again in %.1f s",
                                 process.pid, process.returncode, restart_at - self._clock())
                    slot.process, slot.restart_at, slot.is_first = None, restart_at, False
            # Drain: the API processes first (each finishes what it accepted), then the engines.
            self._stop(running(), signal.SIGTERM)
            engines = self._engine_processes()
            self._stop(engines, signal.SIGTERM)
            return drained_exit_status([engine.returncode for engine in engines], signal.SIGTERM)
        finally:
            if self._fork_server is not None:
                self._fork_server.close()
            self._listening.close()
            if self._metrics is not None:
                self._metrics.close()
            for process in (*self._engine_processes(), *running()):
                if process.poll() is None:
                    process.kill()
            if self._rate_buckets is not None:
                self._rate_buckets.remove()
            for process in (*self._engine_processes(), *running()):
                process.wait()  # nobody writes to the run directory any more
            shutil.rmtree(self._run_directory, ignore_errors=True)  # the engine's socket, snapshots, restart count
            remove_blocks(block_prefix(os.getpid()))  # pixel slots of API processes that could not unlink theirs

    def _watch_engines(self, backoff: RestartBackoff, running: Callable[[], list[ApiProcess]]) -> int | None:
        """Start again the engines whose time has come, and note the ones that died; the server's exit status
        when it must stop (an engine that never loaded its model, or a crash loop), else ``None``."""
        for index, slot in enumerate(self._engines):
            if slot.process is None:
                if self._clock() >= slot.restart_at:
                    self._start_engine(slot)
                    backoff.started(index)
                    self.num_engine_restarts += 1
                    write_engine_restart_count(self._run_directory, self.num_engine_restarts)
                    logger.info("started engine %d again (pid %d)", index, slot.process.pid)  # type: ignore[union-attr]
                continue
            process = slot.process
            if process.poll() is None:
                slot.has_listened = slot.has_listened or slot.listens()
                continue
            if not slot.has_listened:
                reason = read_start_failure(self._run_directory, engine_name(index))
                if process.returncode == EXIT_CONFIGURATION_ERROR and reason is not None:
                    self._stop_all(running(), EXIT_CONFIGURATION_ERROR)
                    raise StartupError(self._in_context(slot.plan, reason))
                logger.critical("engine %d exited with status %d before its model was loaded: stopping the server",
                                index, process.returncode)
                return self._stop_all(running(), process.returncode if process.returncode > 0 else EXIT_ENGINE_DIED)
            restart_at = backoff.died(index)
            if restart_at is None:
                logger.critical("crash loop: engines died %d times within %.0f s (the last, engine %d, with status "
                                "%d); stopping the server with exit status %d", self._policy.max_crashes,
                                self._policy.crash_window_s, index, process.returncode, EXIT_ENGINE_CRASH_LOOP)
                return self._stop_all(running(), EXIT_ENGINE_CRASH_LOOP)
            logger.error("engine %d (pid %d) exited with status %d: its requests in flight failed; starting it again "
                         "in %.1f s", index, process.pid, process.returncode, restart_at - self._clock())
            Path(slot.socket_path).unlink(missing_ok=True)
            slot.process, slot.restart_at = None, restart_at
        return None

    def _in_context(self, plan: EnginePlan, reason: str) -> str:
        """An engine's start-up refusal, prefixed with the ``--devices`` entry it ran on when that was given
        (the engine sees only ``--device cuda``, a flag the user did not pass)."""
        if self._settings.devices is None:
            return reason
        devices = ",".join(self._settings.devices)
        return (f"--devices {devices} (MMSERVE_DEVICES): engine {plan.index} on "
                f"{self._settings.devices[plan.index]}: {reason}")

    def _stop_all(self, api_processes: list[ApiProcess], exit_code: int) -> int:
        self._stop(api_processes, signal.SIGKILL)
        self._stop(self._engine_processes(), signal.SIGTERM)
        return exit_code

    def _forget(self, pid: int) -> None:
        """What a dead API process left in the run directory: its ready mark (it no longer counts as serving),
        its metrics request socket (no scrape waits for it), its pixel slots' shared memory when it died without
        unlinking it (``server.workers.pixel_slots``); its snapshot stays for the next scrape to fold into
        the carried counts (``server.workers.counter_carry``: the server's counters do not go down)."""
        forget(self._run_directory, pid)
        remove_request_socket(self._run_directory, pid)
        remove_blocks(block_prefix(os.getpid(), pid))

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


def drained_exit_status(engine_returncodes: list[int | None], sent: int) -> int:
    """The server's exit status once its engines were stopped with signal ``sent``: 0, or the first engine's
    failure. An engine killed by ``sent`` itself was stopped, not failed (its handler gone as it exited);
    one killed by another signal failed, ``EXIT_ENGINE_DIED``: a negative return code is no exit status
    (-15 would read as 241)."""
    for code in engine_returncodes:
        if code in (0, None, -sent):
            continue
        return code if code > 0 else EXIT_ENGINE_DIED
    return 0


def _how_started(process: ApiProcess | None) -> str:
    return "forked by the fork server" if isinstance(process, ForkedProcess) else "a new interpreter"


def run_supervised(settings: Settings, num_api_workers: int) -> int:
    return Supervisor(settings, num_api_workers).run()
