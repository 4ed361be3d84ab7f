"""``metrics_port`` in a split server answers as the public port's ``/metrics`` and ``/health/*`` do.

The supervisor binds the port once and every API process serves it from its
own state (the server's merged ``/metrics``, the server's readiness); the
engines serve none. Before, each engine served its own registry there, and
with ``--engines 2`` the second engine could not bind it, so the server
never started. Two servers, started side by side once for the module:
``--api-workers 2 --engines 2`` and ``--api-workers 2``, both with keys on.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServeProcess, run_serve_processes

KEY = "ops-port-key"
TINY = ["--preset", "tiny", "--device", "cpu", "--api-workers", "2"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, tuple[ServeProcess, int]]]:
    ports = {"engines": _free_port(), "api": _free_port()}
    specs = [([*TINY, "--engines", "2"], {"MMSERVE_API_KEYS": KEY, "MMSERVE_METRICS_PORT": str(ports["engines"])}),
             (TINY, {"MMSERVE_API_KEYS": KEY, "MMSERVE_METRICS_PORT": str(ports["api"])})]
    with run_serve_processes(specs) as (engines, api):
        yield {"engines": (engines, ports["engines"]), "api": (api, ports["api"])}


def _families(exposition: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", exposition, re.M))


def _api_processes(served: ServeProcess) -> set[int]:
    pid = served.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return {int(child) for child in children
            if "api_process" in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace")}


def _owner(pids: set[int], server_port: int, client_port: int) -> int | None:
    """The process holding the server end of the connection 127.0.0.1:client_port -> server_port."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
            inodes.add(fields[9])
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) in {f"socket:[{inode}]" for inode in inodes}:
                    return pid
            except OSError:
                continue
    return None


def _answering_processes(served: ServeProcess, port: int, num_connections: int = 24) -> set[int]:
    """Which API processes answer ``/health/live`` on ``port`` over ``num_connections`` connections."""
    pids = _api_processes(served)
    owners = set()
    for _ in range(num_connections):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert conn.recv(4096).startswith(b"HTTP/1.1 200")  # answered: the connection is held by a process
            owners.add(_owner(pids, port, conn.getsockname()[1]))
    return owners


@pytest.mark.parametrize("name", ["engines", "api"])
def test_the_metrics_port_shows_the_public_ports_metrics_without_a_key(servers, name):
    served, port = servers[name]
    httpx.post(f"{served.url}/v1/infer", json={"text": "a"}, headers={"Authorization": f"Bearer {KEY}"},
               timeout=60).raise_for_status()
    assert httpx.post(f"{served.url}/v1/infer", json={"text": "a"}, timeout=30).status_code == 401
    public = httpx.get(f"{served.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert public.status_code == 200
    ops = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    assert ops.status_code == 200
    assert _families(ops.text) == _families(public.text)
    assert "mmserve_api_workers_live" in _families(ops.text)  # the API processes' series, not an engine's alone
    assert re.search(r"^mmserve_api_workers_live 2\.0$", ops.text, re.M)
    for engine in ("0", "1") if name == "engines" else ():
        assert f'engine="{engine}"' in public.text and f'engine="{engine}"' in ops.text


@pytest.mark.parametrize("name", ["engines", "api"])
def test_the_metrics_port_answers_health_and_nothing_else(servers, name):
    served, port = servers[name]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as probes:
        assert probes.get("/health/ready").status_code == 200
        assert probes.get("/health/ready").json() == httpx.get(f"{served.url}/health/ready", timeout=30).json()
        assert probes.get("/health/live").status_code == 200
        assert probes.post("/v1/infer", json={"text": "a"}).status_code == 404
        assert probes.get("/v1/models").status_code == 404
        assert probes.get("/docs").status_code == 404
    # The server's readiness, as the API processes judge it (server.workers.readiness), not an engine's own.
    assert _answering_processes(served, port, num_connections=4) <= _api_processes(served)


@pytest.mark.parametrize("name", ["engines", "api"])
def test_every_api_process_serves_the_metrics_port(servers, name):
    served, port = servers[name]
    assert _answering_processes(served, port) == _api_processes(served)


def test_a_restarted_api_process_serves_the_metrics_port_again(servers):
    served, port = servers["api"]
    before = _api_processes(served)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    for _ in range(10):  # meanwhile the other answers alone
        assert httpx.get(f"http://127.0.0.1:{port}/health/live", timeout=10).status_code == 200
    deadline = time.monotonic() + 60
    while True:
        after = _api_processes(served)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        if len(after) == 2 and victim not in after and re.search(r"^mmserve_api_workers_live 2\.0$", text, re.M):
            break
        assert time.monotonic() < deadline, "the API process was never started again"
        time.sleep(0.2)
    assert re.search(r"^mmserve_api_worker_restarts_total 1\.0$", text, re.M)
    assert _answering_processes(served, port) == after
