"""The supervisor's side of the API processes' fork server: starting it, asking it for a process, the handle.

``server.workers.api_forkserver`` forks each API process and hands it to the
supervisor as its child (a double fork; the supervisor is a child subreaper,
so the kernel re-parents the API process to it). The supervisor then handles
it as it handled one it started with ``subprocess.Popen``: ``ForkedProcess``
offers the part of ``Popen`` it uses (``pid``, ``returncode``, ``poll``,
``wait``, ``send_signal``, ``kill``), reading the exit status with
``waitpid``, so restarts, backoff, the crash loop and the restart count do not
know how a process was started.

Being a subreaper has one more effect: any orphaned descendant of the server
(a process the engine started, left behind when the engine died) becomes the
supervisor's child rather than init's; ``reap_strays`` collects those that exit.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping

logger = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
# numpy's OpenBLAS would start a thread pool at import; the fork server must fork with one thread. API processes
# run no BLAS (they decode and tokenize), and the setting reaches only the fork server and its forks.
SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
FIRST_FORK_TIMEOUT_S = 300.0  # the fork server imports first (seconds; more on a busy machine)
FORK_TIMEOUT_S = 30.0


class ForkFailed(Exception):
    """The fork server gave no process; the message says why."""


def become_child_subreaper() -> bool:
    """Make this process inherit its orphaned descendants (Linux ``prctl``); whether it is one now."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        logger.warning("prctl(PR_SET_CHILD_SUBREAPER) failed: %s", os.strerror(ctypes.get_errno()))
        return False
    return True


class ForkedProcess:
    """An API process the fork server forked, now this process's child: the ``subprocess.Popen`` calls it takes."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not a child (cannot happen once adopted): gone, status unknown
                self.returncode = 255
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)  # -N: killed by signal N, as Popen says
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"API process {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a pid that was reaped (and may be another process's now)
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The running fork server and this process's end of its control socket."""

    def __init__(self, process: subprocess.Popen, control: socket.socket) -> None:
        self.process = process
        self._control = control
        self._num_forked = 0

    @classmethod
    def start(cls, environment: Mapping[str, str], listening_fd: int,
              inherited_fds: tuple[int, ...] = ()) -> ForkServer | None:
        """Start the fork server (it imports meanwhile); ``None`` where forks cannot become this process's children.
        ``inherited_fds``: other sockets its forks keep (the metrics port's)."""
        if not become_child_subreaper():
            logger.warning("API processes start as new interpreters: this process cannot adopt forked ones")
            return None
        ours, theirs = socket.socketpair()
        with theirs:
            process = subprocess.Popen(
                [sys.executable, "-m", "server.workers.api_forkserver", str(theirs.fileno()), str(listening_fd)],
                env={**environment, **SINGLE_THREADED}, pass_fds=(theirs.fileno(), listening_fd, *inherited_fds))
        return cls(process, ours)

    def fork(self) -> ForkedProcess:
        """A new API process, this process's child. ``ForkFailed``: none, and the fork server is of no more use."""
        self._control.settimeout(FIRST_FORK_TIMEOUT_S if self._num_forked == 0 else FORK_TIMEOUT_S)
        try:
            self._control.sendall(b"fork\n")
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = self._control.recv(64)
                if not chunk:
                    raise ForkFailed("the fork server closed its socket (it exited)")
                answer += chunk
        except OSError as e:  # a timeout, or the fork server is gone
            raise ForkFailed(f"no answer from the fork server: {e!r}") from e
        text = answer.decode(errors="replace").strip()
        if not text.isdigit():
            raise ForkFailed(f"the fork server refused: {text}")
        self._num_forked += 1
        return ForkedProcess(int(text))

    def close(self) -> None:
        """Stop the fork server: at the end of its control socket it exits."""
        self._control.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def reap_strays(own_pids: set[int]) -> None:
    """Reap exited children this process adopted as a subreaper, leaving ``own_pids`` to their handles."""
    while True:
        try:
            found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # no children at all
            return
        if found is None or found.si_pid in own_pids:
            return  # an own child's exit is its handle's to read; a stray behind it waits for the next call
        os.waitpid(found.si_pid, 0)
