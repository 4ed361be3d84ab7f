"""A supervised child ends when its parent is not the supervisor that started it, even from its first moment."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from server.workers.orphan_guard import ORPHANED_EXIT_CODE

CHILD = ("import sys, time; from server.workers.orphan_guard import exit_when_orphaned; "
         "exit_when_orphaned(0.05, parent_pid=None if sys.argv[1] == 'now' else int(sys.argv[1])); time.sleep(20)")


def start(parent: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, parent], env={**os.environ, "PYTHONPATH": os.getcwd()})


def test_a_child_whose_parent_is_not_the_supervisor_it_was_given_exits_at_once():
    """As when an API process is started again just before its supervisor is killed: re-parented already."""
    not_its_parent = start("1")  # its parent is this test, not init
    started_s = time.monotonic()
    assert not_its_parent.wait(timeout=15) == ORPHANED_EXIT_CODE
    assert time.monotonic() - started_s < 15


def test_a_child_of_its_supervisor_lives_on():
    for parent in ("now", str(os.getpid())):
        child = start(parent)
        try:
            time.sleep(1.0)
            assert child.poll() is None
        finally:
            child.kill()
            child.wait()
