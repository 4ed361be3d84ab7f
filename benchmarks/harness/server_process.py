"""Servers under benchmark as their own process groups: start, wait until ready, pause, stop.

Each server starts in a new session and is signalled as a group, so its
forked workers stop with it and a SIGSTOP keeps an idle server's polling off
the CPU while another is measured. ``running`` keeps one server for a block;
``paused_servers`` starts a set one after the other; ``resumed`` runs one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.harness.cpu_accounting import group_cpu_s

_POLL_INTERVAL_S = 0.25
_STOP_TIMEOUT_S = 30.0
_STDERR_TAIL_CHARS = 3000
READY_TIMEOUT_S = 600.0  # a large preset on a busy CPU takes minutes to load and warm


class ServerStartError(RuntimeError):
    """A server process exited or never became ready; the message (and ``stderr_tail``) carry its stderr tail."""

    def __init__(self, message: str, stderr_tail: str) -> None:
        super().__init__(f"{message}:\n{stderr_tail}")
        self.stderr_tail = stderr_tail


@dataclass(frozen=True)
class ServerCommand:
    """How to start one server and how to tell that it is ready."""

    name: str
    argv: tuple[str, ...]
    port: int
    ready_path: str
    env: Mapping[str, str] = field(default_factory=dict)
    unset_env: tuple[str, ...] = ()  # variables of this process the server must not inherit
    # Where it runs; None: here. ``python -m`` puts its working directory first on sys.path, before
    # PYTHONPATH, so a server of another source tree must run in that tree.
    cwd: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def free_port() -> int:
    """A loopback port nobody listens on right now (the server binds it shortly after)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """A running server (a process group) started from a ``ServerCommand``."""

    def __init__(self, command: ServerCommand) -> None:
        self.command = command
        self._stderr = tempfile.TemporaryFile(mode="w+b")
        self._process = subprocess.Popen(
            command.argv,
            env={**{k: v for k, v in os.environ.items() if k not in command.unset_env}, **command.env},
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            cwd=command.cwd,
            start_new_session=True,  # its own process group: signals reach the children it forks
        )
        self._is_paused = False

    @property
    def url(self) -> str:
        return self.command.url

    @property
    def pid(self) -> int:
        """The server's main process (the group's leader), e.g. for a profiler to attach to."""
        return self._process.pid

    def stderr_tail(self, max_chars: int = _STDERR_TAIL_CHARS) -> str:
        """The last ``max_chars`` of what the server wrote to stderr (its log)."""
        self._stderr.flush()
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - max_chars))
        return self._stderr.read().decode("utf-8", errors="replace")

    def wait_ready(self, timeout_s: float) -> None:
        """Poll the ready path until it answers 200; raise if the process dies or time runs out."""
        deadline_s = time.monotonic() + timeout_s
        ready_url = self.url + self.command.ready_path
        while True:
            if self._process.poll() is not None:
                raise ServerStartError(f"{self.command.name} exited with {self._process.returncode} during start-up",
                                       self.stderr_tail())
            try:
                if httpx.get(ready_url, timeout=2.0, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline_s:
                raise ServerStartError(f"{self.command.name} was not ready after {timeout_s:.0f} s",
                                       self.stderr_tail())
            time.sleep(_POLL_INTERVAL_S)

    def cpu_s(self) -> float:
        """CPU seconds (user + system) used so far by the live processes of the server's group."""
        return group_cpu_s(self._process.pid)

    def _signal_group(self, signum: signal.Signals) -> None:
        try:
            os.killpg(self._process.pid, signum)
        except ProcessLookupError:
            pass

    def pause(self) -> None:
        """Stop every process of the server (SIGSTOP) so that it uses no CPU while idle."""
        if not self._is_paused:
            self._signal_group(signal.SIGSTOP)
            self._is_paused = True

    def resume(self) -> None:
        if self._is_paused:
            self._signal_group(signal.SIGCONT)
            self._is_paused = False

    def stop(self) -> None:
        """SIGTERM to the group, then SIGKILL if it has not exited within the stop timeout."""
        if self._process.poll() is None:
            self.resume()
            self._signal_group(signal.SIGTERM)
            try:
                self._process.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self._process.wait()
        # Children that outlived the leader (forked workers) go with the group.
        self._signal_group(signal.SIGKILL)
        self._stderr.close()


@contextmanager
def running(command: ServerCommand, ready_timeout_s: float = READY_TIMEOUT_S) -> Iterator[ServerProcess]:
    """A ready server for the block's duration; stopped (with its children) on the way out."""
    server = ServerProcess(command)
    try:
        server.wait_ready(ready_timeout_s)
        yield server
    finally:
        server.stop()


def start_paused(command: ServerCommand, ready_timeout_s: float = READY_TIMEOUT_S) -> ServerProcess:
    """A ready server, paused until a run resumes it; stopped again if it never became ready.

    The caller owns it and stops it (``paused_servers`` does that for a set).
    """
    server = ServerProcess(command)
    try:
        server.wait_ready(ready_timeout_s)
    except BaseException:
        server.stop()
        raise
    server.pause()
    return server


@contextmanager
def paused_servers(commands: Mapping[str, ServerCommand],
                   ready_timeout_s: float = READY_TIMEOUT_S) -> Iterator[dict[str, ServerProcess]]:
    """Every server of ``commands``, started one after the other and paused; all stopped on the way out.

    One at a time, so that no start-up (loading, warming) competes with
    another's for the cores; paused, so that an idle server's polling takes
    no CPU from the runs of the one being measured (``resumed``).
    """
    with ExitStack() as stack:
        servers: dict[str, ServerProcess] = {}
        for name, command in commands.items():
            servers[name] = start_paused(command, ready_timeout_s)
            stack.callback(servers[name].stop)
        yield servers


@contextmanager
def resumed(server: ServerProcess) -> Iterator[ServerProcess]:
    """``server`` running for the block (one measured run), paused again after it."""
    server.resume()
    try:
        yield server
    finally:
        server.pause()
