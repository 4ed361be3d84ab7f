"""A ``--grpc-port`` or ``metrics_port`` taken after the pre-load check, before its listener binds it.

``check_other_ports`` binds each port and closes it before the model loads;
the listeners bind them for real inside the app's lifespan (in each API
process with ``--api-workers 2``, in the engine for ``metrics_port``), a
model load later. Another program can take a port in between. The server
is started through ``server.cli.main`` with ``check_other_ports`` wrapped so
that it takes the ports itself once the check has passed (and holds them
until it exits): the race, every time, with no sleep. Start-up must end as
for a port taken before the check: one last line naming the setting, exit 2,
no traceback.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_bad_start import BadStart, _problems

pytestmark = pytest.mark.long  # each loads the tiny preset before its listener fails

# `mmserve serve`, with the ports taken right after the check passed (the supervisor holds them with --api-workers 2)
TAKE_PORTS_AFTER_CHECK = """
import socket, sys
import server.runtime.startup_checks as checks
from server.cli import main
check, held = checks.check_other_ports, []
def check_then_take(settings):
    check(settings)
    for port in (settings.grpc_port, settings.metrics_port):
        if port is not None:
            sock = socket.socket()
            sock.bind((settings.host, port))
            sock.listen()
            held.append(sock)
checks.check_other_ports = check_then_take
sys.exit(main())
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cases() -> list[BadStart]:
    grpc_port, metrics_port = _free_port(), _free_port()
    grpc = ("--grpc-port", str(grpc_port), "MMSERVE_GRPC_PORT")
    metrics = ("metrics_port", str(metrics_port), "MMSERVE_METRICS_PORT")
    metrics_env = (("MMSERVE_METRICS_PORT", str(metrics_port)),)
    return [
        BadStart("gRPC port taken late", ("--grpc-port", str(grpc_port)), grpc, fails_before_loading=False),
        BadStart("metrics port taken late", (), metrics, env=metrics_env, fails_before_loading=False),
        BadStart("gRPC port taken late, two API processes", ("--grpc-port", str(grpc_port), "--api-workers", "2"),
                 grpc, fails_before_loading=False),
        BadStart("metrics port taken late, two API processes", ("--api-workers", "2"), metrics, env=metrics_env,
                 fails_before_loading=False),
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda case: case.name)
def test_a_port_taken_after_the_check_ends_start_up_in_one_line(case: BadStart):
    env = {**os.environ, "MMSERVE_LOG_LEVEL": "info", **dict(case.env)}
    process = subprocess.run([sys.executable, "-c", TAKE_PORTS_AFTER_CHECK, "serve", "--preset", "tiny",
                              "--host", "127.0.0.1", "--port", "0", *case.args], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=300, cwd=Path(__file__).parents[2])
    problems = _problems(case, process.stdout, process.returncode, expected_returncode=2)
    assert not problems, f"{', '.join(problems)}\n{process.stdout[-2500:]}"
