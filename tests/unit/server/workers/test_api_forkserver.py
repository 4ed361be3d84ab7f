"""The fork server forks API processes that become the asking process's children, single-threaded, torch-free.

The asking process here is a child Python process playing the supervisor (it
becomes a child subreaper, which a process stays): it starts a real fork
server, asks it for API processes and reports what it sees. With no engine to
connect to, a forked API process waits for one, so it is alive to look at;
had it not been adopted, its orphan guard would end it (status 70) before the
kill this test sends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SUPERVISOR = """
import json, os, signal, socket, tempfile, time
from pathlib import Path
from server.settings import Settings
from server.workers.forked_process import ForkServer
from server.workers.handoff import (ENGINE_SOCKETS_VARIABLE, RUN_DIRECTORY_VARIABLE, SETTINGS_VARIABLE,
                                    SUPERVISOR_PID_VARIABLE, settings_json)

def stat(pid):
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()

run_directory = tempfile.mkdtemp()
environment = {**os.environ, SETTINGS_VARIABLE: settings_json(Settings(preset="tiny")),
               ENGINE_SOCKETS_VARIABLE: f"{run_directory}/engine-0.sock", RUN_DIRECTORY_VARIABLE: run_directory,
               SUPERVISOR_PID_VARIABLE: str(os.getpid())}
listening = socket.create_server(("127.0.0.1", 0))
fork_server = ForkServer.start(environment, listening.fileno())
first, second = fork_server.fork(), fork_server.fork()
time.sleep(2.0)  # an orphaned one would have seen its parent by now (its guard polls every 0.5 s)
seen = {
    "parents": [int(stat(process.pid)[1]) for process in (first, second)],
    "me": os.getpid(),
    "alive": [process.poll() is None for process in (first, second)],
    "command_line": Path(f"/proc/{first.pid}/cmdline").read_bytes().rstrip(b"\\0").decode().split("\\0")[1:],
    "listening_fd": listening.fileno(),
    "fork_server_threads": len(os.listdir(f"/proc/{fork_server.process.pid}/task")),
    "fork_server_maps_libtorch": "libtorch" in Path(f"/proc/{fork_server.process.pid}/maps").read_text(),
    "api_process_maps_libtorch": "libtorch" in Path(f"/proc/{first.pid}/maps").read_text(),
}
first.kill()
second.send_signal(signal.SIGUSR1)  # by default, the end of a process
seen["statuses"] = [first.wait(30), second.wait(30)]
fork_server.close()
seen["fork_server_status"] = fork_server.process.returncode
print(json.dumps(seen))
"""


def test_forked_api_processes_are_the_askers_children_named_as_api_processes():
    done = subprocess.run([sys.executable, "-c", SUPERVISOR], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["parents"] == [seen["me"], seen["me"]]  # adopted, not the fork server's children
    assert seen["alive"] == [True, True]  # their orphan guards saw the parent they were told of
    assert seen["command_line"] == ["-m", "server.workers.api_process", str(seen["listening_fd"])]
    assert seen["fork_server_threads"] == 1
    assert not seen["fork_server_maps_libtorch"] and not seen["api_process_maps_libtorch"]
    assert seen["statuses"] == [-9, -10]  # read by waitpid, as Popen reads them
    assert seen["fork_server_status"] == 0  # it exits at the end of its control socket
