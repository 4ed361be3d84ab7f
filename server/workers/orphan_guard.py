"""A child of the supervisor ends when the supervisor is gone, whatever killed it.

The supervisor stops its engine and API processes itself on SIGTERM and when
the engine dies, but a supervisor killed with SIGKILL (an OOM kill, a test
that times out) runs no code: its children would be re-parented to init and
go on holding the model, the port's shared socket and their shared memory.
Each child therefore watches its parent's pid and exits when it changes.
Polling ``os.getppid`` is used rather than ``prctl(PR_SET_PDEATHSIG)``: the
latter fires when the *thread* that started the child exits, and the
supervisor restarts API processes from whichever thread noticed the death.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
ORPHANED_EXIT_CODE = 70


def exit_when_orphaned(poll_interval_s: float = POLL_INTERVAL_S) -> threading.Thread:
    """Start a daemon thread that ends this process (``os._exit``) once its parent is no longer the one it had."""
    parent_pid = os.getppid()

    def watch() -> None:
        while not stopped.wait(poll_interval_s):
            if os.getppid() != parent_pid:
                logger.error("the supervisor (pid %d) is gone; exiting", parent_pid)
                os._exit(ORPHANED_EXIT_CODE)

    stopped = threading.Event()
    thread = threading.Thread(target=watch, name="mmserve-orphan-guard", daemon=True)
    thread.start()
    return thread
