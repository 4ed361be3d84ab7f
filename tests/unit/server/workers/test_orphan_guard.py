"""A supervised child ends when its parent is not the supervisor that started it, even from its first moment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

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


CLEANING_CHILD = """
import os, sys, time
from pathlib import Path
from server.workers.orphan_guard import exit_when_orphaned
mark, told = Path(sys.argv[1]), Path(sys.argv[2])
parent = os.getppid()
exit_when_orphaned(60, on_orphaned=lambda: mark.write_text("cleaned"))
Path(f"{mark}.started").touch()
while os.getppid() == parent and not told.exists():
    time.sleep(0.01)
sys.exit(3)
"""
STARTER = """
import subprocess, sys, time
from pathlib import Path
child = subprocess.Popen([sys.executable, "-c", *sys.argv[1:]])
while not Path(f"{sys.argv[2]}.started").exists() and child.poll() is None:
    time.sleep(0.01)  # its guard knows this process for its parent first
sys.exit(0 if sys.argv[-1].endswith("orphan") else child.wait())
"""


def exit_on_its_own(mark: Path, how: str) -> None:
    """A child whose guard polls once a minute, and which exits by its own path (code 3) once its parent is gone
    (``how`` "orphan": its starter exits at once) or once told to (``how`` "told": its starter waits on it)."""
    told = mark.with_name(how)
    starter = subprocess.Popen([sys.executable, "-c", STARTER, CLEANING_CHILD, str(mark), str(told)],
                               env={**os.environ, "PYTHONPATH": os.getcwd()})
    if how == "told":
        assert wait_for(mark.with_name(mark.name + ".started"), 15)
        told.touch()
    assert starter.wait(timeout=15) in (0, 3)


def wait_for(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


def test_an_orphan_that_exits_before_its_guard_polls_still_cleans_up(tmp_path):
    """As an API process that loses the engine (whose guard fired first) and exits before its own guard polls
    again: the shared rate-limit table must still go."""
    mark = tmp_path / "cleaned"
    exit_on_its_own(mark, "orphan")
    assert wait_for(mark, 15)  # well before the guard's next poll, a minute away
    assert mark.read_text() == "cleaned"


def test_a_child_of_its_supervisor_that_exits_leaves_the_clean_up_to_it(tmp_path):
    mark = tmp_path / "cleaned"
    exit_on_its_own(mark, "told")
    assert not wait_for(mark, 0.5)


def test_a_child_of_its_supervisor_lives_on():
    for parent in ("now", str(os.getpid())):
        child = start(parent)
        try:
            time.sleep(1.0)
            assert child.poll() is None
        finally:
            child.kill()
            child.wait()
