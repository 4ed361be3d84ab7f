"""``--api-workers 2``: the pixel slots' shared memory after an API process and an engine are SIGKILLed and the
server is stopped: nothing left in ``/dev/shm``, and no ``resource_tracker`` warning of a leak in the log."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from encoded_images import encoded_image_b64
from tests.conftest import run_serve_process
from tests.integration.test_api_workers_faults import (
    TINY,
    api_processes_of,
    children_of,
    command_line,
    live_api_processes,
    restarts,
)

pytestmark = pytest.mark.long

SHARED_MEMORY = Path("/dev/shm")
RESTART_WITHIN_S = 180.0  # a start on a loaded machine (test_api_workers_faults)


def mapped_shared_memory(pid: int) -> set[str]:
    """The names of the ``/dev/shm`` files process ``pid`` maps now."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split("/dev/shm/", 1)[1].removesuffix(" (deleted)") for line in lines if "/dev/shm/" in line}


def engine_of(supervisor: int) -> int:
    (pid,) = [pid for pid in children_of(supervisor) if "engine_process" in command_line(pid)]
    return pid


def send_images(url: str, num_requests: int = 4) -> None:
    """Image requests on new connections (both API processes): each API process's block holds pixels the
    engine attached and copied out."""
    for seed in range(num_requests):
        answer = httpx.post(f"{url}/v1/infer", json={"image": {"b64": encoded_image_b64(seed)}},
                            headers={"Connection": "close"}, timeout=60)
        assert answer.status_code == 200, answer.text


def wait_until(condition, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + RESTART_WITHIN_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def serves_images(url: str) -> bool:
    try:
        return httpx.post(f"{url}/v1/infer", json={"image": {"b64": encoded_image_b64(99)}},
                          headers={"Connection": "close"}, timeout=60).status_code == 200
    except httpx.TransportError:
        return False


def test_killed_processes_and_a_stop_leave_no_shared_memory_and_log_no_leak():
    with run_serve_process(TINY) as served:
        url, supervisor = served.url, served.process.pid
        send_images(url)
        blocks = set().union(*(mapped_shared_memory(pid) for pid in api_processes_of(supervisor)))
        assert len(blocks) >= 2, blocks  # one per API process, the rate table only with a rate limit
        killed = min(api_processes_of(supervisor))
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: killed not in api_processes_of(supervisor) and len(api_processes_of(supervisor)) == 2
                   and live_api_processes(url) == 2 and restarts(url) == 1, "the API process was not started again")
        send_images(url)
        engine = engine_of(supervisor)
        blocks |= mapped_shared_memory(engine)  # the engine attached the successor's block too
        os.kill(engine, signal.SIGKILL)
        wait_until(lambda: serves_images(url), "the engine never served again")
        send_images(url)
        blocks |= set().union(*(mapped_shared_memory(pid) for pid in api_processes_of(supervisor)))
        served.process.send_signal(signal.SIGTERM)
        output, _ = served.process.communicate(timeout=120)
    assert served.process.returncode == 0, output
    assert "leaked shared_memory" not in output and "resource_tracker" not in output, output
    assert not [name for name in blocks if (SHARED_MEMORY / name).exists()], blocks
    assert not list(SHARED_MEMORY.glob(f"mmserve-pixels-{supervisor}-*"))  # server.workers.pixel_slots.block_prefix
