"""The supervisor's handle on a forked API process, and the strays a subreaper adopts.

A process that becomes a child subreaper stays one, so what needs it runs in
a child Python process of its own (``run_script``), never in the test process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from server.workers.forked_process import ForkedProcess


def spawn(code: str) -> int:
    """A child of this process running ``code``, with no ``Popen`` of its own that could reap it first."""
    return os.posix_spawn(sys.executable, [sys.executable, "-c", code], os.environ)


def run_script(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_forked_process_reports_its_exit_status_as_popen_does():
    process = ForkedProcess(spawn("import sys; sys.exit(3)"))
    assert process.wait(timeout=60) == 3
    assert process.poll() == process.returncode == 3


def test_a_killed_process_reads_as_minus_the_signal_and_wait_times_out_before():
    process = ForkedProcess(spawn("import time; time.sleep(60)"))
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.2)
    process.kill()
    assert process.wait(timeout=60) == -signal.SIGKILL
    process.send_signal(signal.SIGTERM)  # reaped: its pid is nobody's to signal now, and nothing is sent
    assert process.returncode == -signal.SIGKILL


STRAYS = """
import os, time
from pathlib import Path
from server.workers.forked_process import become_child_subreaper, reap_strays

def is_zombie(pid):
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"

assert become_child_subreaper()
read_end, write_end = os.pipe()
middle = os.fork()
if middle == 0:  # starts a process, then exits: the process is orphaned, and adopted by this subreaper
    stray = os.fork()
    if stray == 0:
        time.sleep(0.2)
        os._exit(7)
    os.write(write_end, str(stray).encode())
    os._exit(0)
os.waitpid(middle, 0)
stray = int(os.read(read_end, 32))
own = os.fork()
if own == 0:
    os._exit(5)
while not (is_zombie(stray) and is_zombie(own)):
    time.sleep(0.01)
reap_strays({own})  # may meet `own` first and leave the stray for the next call
own_status = os.waitstatus_to_exitcode(os.waitpid(own, 0)[1])  # still there for its own handle
reap_strays(set())
print(own_status, Path(f"/proc/{stray}").exists())
"""


def test_a_subreaper_reaps_the_orphans_it_adopts_but_not_its_own_children():
    assert run_script(STRAYS).split() == ["5", "False"]


NAMED = """
import sys
from pathlib import Path
from server.workers.api_forkserver import name_process

name_process(["-m", "server.workers.api_process", "3"])
named = Path("/proc/self/cmdline").read_bytes()
name_process(["-m", "x" * 100_000])  # does not fit: left as it was
print(repr(named), repr(Path("/proc/self/cmdline").read_bytes() == named))
"""


def test_a_forked_process_names_itself_in_its_command_line():
    named, unchanged = run_script(NAMED + "#" * 200).split()  # the comment: room to write the new line in
    line = eval(named)  # noqa: S307 - the repr of bytes this test printed
    assert line.rstrip(b"\0").split(b"\0")[1:] == [b"-m", b"server.workers.api_process", b"3"]
    assert line.split(b"\0")[0] == os.fsencode(sys.executable)
    assert unchanged == "True"

