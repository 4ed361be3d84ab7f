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
"""

from __future__ import annotations

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
    ``on_orphaned``: called first, to clean up what the supervisor can no longer (errors are logged).
    """
    parent_pid = os.getppid() if parent_pid is None else parent_pid

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                logger.error("the supervisor (pid %d) is gone; exiting", parent_pid)
                if on_orphaned is not None:
                    try:
                        on_orphaned()
                    except Exception:  # noqa: BLE001 - exiting anyway
                        logger.exception("cleaning up after the supervisor failed")
                os._exit(ORPHANED_EXIT_CODE)
            if stopped.wait(poll_interval_s):
                return

    stopped = threading.Event()
    thread = threading.Thread(target=watch, name="mmserve-orphan-guard", daemon=True)
    thread.start()
    return thread
