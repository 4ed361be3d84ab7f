"""Servers under benchmark as their own processes: start, wait until ready, pause, stop.

A comparison measures servers the way users run them: each in its own process
(group), on loopback, configured from its command line and environment, and
ready only when its health endpoint says so. LitServe forks an API-server
process, an inference worker and a queue manager, so every server is started
in a new session and signalled as a process group: stopping it stops all of
its children, and pausing it (SIGSTOP) keeps an idle server's polling loops
off the CPU while the other server is measured.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

_POLL_INTERVAL_S = 0.25
_STOP_TIMEOUT_S = 30.0
_STDERR_TAIL_CHARS = 3000


class ServerStartError(RuntimeError):
    """A server process exited or never became ready; the message carries its stderr tail."""


@dataclass(frozen=True)
class ServerCommand:
    """How to start one server and how to tell that it is ready."""

    name: str
    argv: tuple[str, ...]
    port: int
    ready_path: str
    env: Mapping[str, str] = field(default_factory=dict)
    unset_env: tuple[str, ...] = ()  # variables of this process the server must not inherit

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def free_port() -> int:
    """A loopback port nobody listens on right now (the server binds it shortly after)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _mmserve_serve(source: tuple[str, str], settings: Mapping[str, str], device: str,
                   port: int | None) -> ServerCommand:
    port = free_port() if port is None else port
    env = {"MMSERVE_LOG_LEVEL": "warning", **{f"MMSERVE_{name}": value for name, value in settings.items()}}
    argv = (sys.executable, "-m", "server.cli", "serve", *source, "--port", str(port), "--device", device)
    return ServerCommand("mmserve", argv, port, "/health/ready", env)


def mmserve_command(preset: str, settings: Mapping[str, str], *, device: str = "cpu",
                    port: int | None = None) -> ServerCommand:
    """``mmserve serve --preset PRESET``; ``settings`` are ``MMSERVE_*`` names without the prefix."""
    return _mmserve_serve(("--preset", preset), settings, device, port)


def mmserve_model_command(model: Path, settings: Mapping[str, str], *, device: str = "cpu",
                          port: int | None = None) -> ServerCommand:
    """``mmserve serve --model DIR`` (a Hugging Face, open_clip or mmserve directory); settings as above."""
    return _mmserve_serve(("--model", str(model)), settings, device, port)


def infinity_command(venv: Path, model: Path, *, served_model_name: str, batch_size: int, device: str = "cpu",
                     port: int | None = None) -> ServerCommand:
    """Infinity (``infinity_emb v2``) serving the Hugging Face directory ``model``, from its own venv.

    ``venv`` is the peer's own virtual environment (``benchmarks.peer_venv``).
    Routes go under ``/v1``, so its embeddings path is mmserve's
    (``/v1/embeddings``); ``/health`` stays where it is. Bound to loopback
    (its default is every interface), usage statistics off. It inherits
    no ``PYTHONPATH``: a worktree's top-level packages (``kernels``,
    ``models``) would shadow names its libraries look for.
    """
    port = free_port() if port is None else port
    argv = (str(venv / "bin" / "infinity_emb"), "v2", "--model-id", str(model),
            "--served-model-name", served_model_name, "--batch-size", str(batch_size), "--device", device,
            "--engine", "torch", "--host", "127.0.0.1", "--port", str(port), "--url-prefix", "/v1",
            "--log-level", "warning")
    env = {"INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    return ServerCommand("infinity", argv, port, "/health", env, unset_env=("PYTHONPATH", "VIRTUAL_ENV"))


def litserve_command(preset: str, *, max_batch_size: int, max_queue_delay_ms: float, device: str = "cpu",
                     is_fast_queue: bool = False, is_traced: bool = False, port: int | None = None) -> ServerCommand:
    """The same preset under LitServe (``benchmarks.peer_litserve_app``), same batch cap and delay.

    ``is_fast_queue`` turns on LitServe's ZeroMQ transport (``fast_queue``);
    ``is_traced`` runs the encoders as TorchScript graphs, as mmserve does by default.
    """
    port = free_port() if port is None else port
    argv = (sys.executable, "-m", "benchmarks.peer_litserve_app", "--preset", preset, "--port", str(port),
            "--device", device, "--max-batch-size", str(max_batch_size),
            "--max-queue-delay-ms", repr(max_queue_delay_ms))
    if is_fast_queue:
        argv += ("--fast-queue",)
    if is_traced:
        argv += ("--torchscript-encoders",)
    return ServerCommand("litserve", argv, port, "/health")


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

    def stderr_tail(self) -> str:
        self._stderr.flush()
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - _STDERR_TAIL_CHARS))
        return self._stderr.read().decode("utf-8", errors="replace")

    def wait_ready(self, timeout_s: float) -> None:
        """Poll the ready path until it answers 200; raise if the process dies or time runs out."""
        deadline_s = time.monotonic() + timeout_s
        ready_url = self.url + self.command.ready_path
        while True:
            if self._process.poll() is not None:
                raise ServerStartError(
                    f"{self.command.name} exited with {self._process.returncode} during start-up:\n"
                    + self.stderr_tail()
                )
            try:
                if httpx.get(ready_url, timeout=2.0, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline_s:
                raise ServerStartError(
                    f"{self.command.name} was not ready after {timeout_s:.0f} s:\n" + self.stderr_tail()
                )
            time.sleep(_POLL_INTERVAL_S)

    def cpu_s(self) -> float:
        """CPU seconds (user + system) used so far by the live processes of the server's group."""
        group_id = self._process.pid
        clock_ticks_per_s = os.sysconf("SC_CLK_TCK")
        total_ticks = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()  # the fields after "(comm)"
            except OSError:  # gone since listdir
                continue
            if int(fields[2]) == group_id:  # pgrp
                total_ticks += int(fields[11]) + int(fields[12])  # utime + stime
        return total_ticks / clock_ticks_per_s

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
def running(command: ServerCommand, ready_timeout_s: float = 600.0) -> Iterator[ServerProcess]:
    """A ready server for the block's duration; stopped (with its children) on the way out."""
    server = ServerProcess(command)
    try:
        server.wait_ready(ready_timeout_s)
        yield server
    finally:
        server.stop()
