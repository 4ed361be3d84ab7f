"""A child of the supervisor ends when the supervisor is gone, whatever killed it.

The supervisor stops its engine and API processes itself on SIGTERM and when
the engine dies, but a supervisor killed with SIGKILL (an OOM kill, a test
that times out) runs no code: its children would be re-parented to init and
go on holding the model, the port's shared socket and their shared memory.
Each child therefore watches its parent's pid and exits when it changes.
Polling ``os.getppid`` is used rather than ``prctl(PR_SET_PDEATHSIG)``: the
latter fires when the *thread* that started the child exits, and the
supervisor restarts API processes from whichever thread noticed the death.
The parent to compare with is the supervisor's pid it handed down
(``MMSERVE_WORKER_SUPERVISOR_PID``), not the parent found at start: a child
started just before its supervisor died (an API process restarted, then the
supervisor killed) is already re-parented when its guard starts, and would
otherwise take init for its supervisor and live on.

What the supervisor would have removed on its way out goes with the orphans
instead (``on_orphaned``): the engine removes the run directory, an API
process the shared rate-limit table (``/dev/shm``), so a SIGKILL leaves nothing.
The guard's poll is not the only way out of an orphan: the engine's guard
often fires first, and an API process that loses the engine then exits on
its own (``server.runtime.lifecycle``) before its guard polls again. So the
clean-up also runs at the process's exit (``atexit``) when the parent is
not the supervisor by then, once whichever path comes first.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
ORPHANED_EXIT_CODE = 70


def exit_when_orphaned(poll_interval_s: float = POLL_INTERVAL_S, parent_pid: int | None = None,
                       on_orphaned: Callable[[], None] | None = None) -> threading.Thread:
    """Start a daemon thread that ends this process (``os._exit``) once its parent is not ``parent_pid``.

    ``parent_pid``: the supervisor's, as handed down; ``None``: the parent this process has now.
    ``on_orphaned``: called first, to clean up what the supervisor can no longer (errors are logged);
    also at this process's exit by any other path, if by then it is orphaned.
    """
    parent_pid = os.getppid() if parent_pid is None else parent_pid
    clean_up = _once(on_orphaned)

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                logger.error("the supervisor (pid %d) is gone; exiting", parent_pid)
                clean_up()
                os._exit(ORPHANED_EXIT_CODE)
            if stopped.wait(poll_interval_s):
                return

    def at_exit() -> None:
        if os.getppid() != parent_pid:
            clean_up()

    atexit.register(at_exit)
    stopped = threading.Event()
    thread = threading.Thread(target=watch, name="mmserve-orphan-guard", daemon=True)
    thread.start()
    return thread


def _once(on_orphaned: Callable[[], None] | None) -> Callable[[], None]:
    """``on_orphaned`` run at most once, whichever of the guard and the exit comes first (errors are logged)."""
    lock = threading.Lock()
    done = False

    def clean_up() -> None:
        nonlocal done
        with lock:
            if done or on_orphaned is None:
                return
            done = True
            try:
                on_orphaned()
            except Exception:  # noqa: BLE001 - exiting anyway
                logger.exception("cleaning up after the supervisor failed")

    return clean_up
