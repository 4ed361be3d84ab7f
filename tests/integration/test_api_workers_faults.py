"""``--api-workers 2`` under faults: a killed API process, a dead engine, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from server.workers.handoff import RATE_BUCKETS_VARIABLE, RUN_DIRECTORY_VARIABLE
from server.workers.supervisor import EXIT_API_PROCESS_START_FAILED
from tests.conftest import run_serve_process

TINY = ["--preset", "tiny", "--device", "cpu", "--api-workers", "2"]


def children_of(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def restarts(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return float(re.search(r"^mmserve_api_worker_restarts_total (\S+)$", text, re.M).group(1))


def test_a_killed_api_process_loses_only_its_requests_and_is_started_again(serve_process):
    with serve_process(TINY) as served:
        url, supervisor = served.url, served.process
        assert restarts(url) == 0
        api_pids = [pid for pid in children_of(supervisor.pid) if "api_process" in command_line(pid)]
        assert len(api_pids) == 2
        answered, dropped, other = [], [], []
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(base_url=url, timeout=30) as client:
                while not stop.is_set():
                    try:
                        status = client.post("/v1/infer", json={"text": "under load"},
                                             headers={"Connection": "close"}).status_code
                        (answered if status == 200 else other).append(status)
                    except httpx.TransportError:
                        dropped.append(1)

        threads = [threading.Thread(target=load) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(1.0)
            answered_before = len(answered)
            os.kill(api_pids[0], signal.SIGKILL)
            time.sleep(0.5)
            answered_meanwhile = len(answered)
            # Not every API process is ready while the killed one starts again.
            ready_while_restarting = httpx.get(f"{url}/health/ready", headers={"Connection": "close"}).status_code
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                current = [pid for pid in children_of(supervisor.pid) if "api_process" in command_line(pid)]
                if len(current) == 2 and api_pids[0] not in current and restarts(url) == 1:
                    break
                time.sleep(0.1)
            else:
                raise AssertionError("the killed API process was not started again")
            while httpx.get(f"{url}/health/ready", headers={"Connection": "close"}).status_code != 200:
                assert time.monotonic() < deadline, "the server did not become ready again"
                time.sleep(0.1)
            time.sleep(1.0)
        finally:  # the load stops whatever failed, or this test process never ends
            stop.set()
            for thread in threads:
                thread.join()
        assert answered_before > 0
        assert ready_while_restarting == 503
        assert answered_meanwhile > answered_before, "the other API process kept answering"
        assert other == [], f"no error answers, only dropped connections: {other}"
        assert len(dropped) <= 4, "only the killed process's in-flight requests are lost"
        assert supervisor.poll() is None
        assert restarts(url) == 1


def test_the_server_exits_non_zero_when_the_engine_dies(serve_process):
    with serve_process(TINY) as served:
        supervisor = served.process
        engines = [pid for pid in children_of(supervisor.pid) if "engine_process" in command_line(pid)]
        api_pids = [pid for pid in children_of(supervisor.pid) if "api_process" in command_line(pid)]
        assert len(engines) == 1
        os.kill(engines[0], signal.SIGKILL)
        assert supervisor.wait(timeout=30) != 0
        for pid in api_pids:
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def is_gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def environment_entry(pid: int, name: str) -> str:
    return next(entry.split("=", 1)[1] for entry in Path(f"/proc/{pid}/environ").read_text().split("\0")
                if entry.startswith(f"{name}="))


def test_the_children_exit_when_the_supervisor_is_killed(serve_process):
    """A supervisor killed with SIGKILL runs no clean-up: the engine and API processes must notice alone,
    and remove what it would have: the run directory and the shared rate-limit table."""
    with serve_process(TINY, {"MMSERVE_RATE_LIMIT": "100/s"}) as served:
        supervisor = served.process
        children = children_of(supervisor.pid)
        assert len(children) == 3  # the engine and two API processes
        run_directory = Path(environment_entry(children[0], RUN_DIRECTORY_VARIABLE))
        bucket_table = Path(environment_entry(children[0], RATE_BUCKETS_VARIABLE))
        assert run_directory.is_dir() and bucket_table.exists()
        os.kill(supervisor.pid, signal.SIGKILL)
        supervisor.wait(timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not all(is_gone(pid) for pid in children):
            time.sleep(0.2)
        left = [pid for pid in children if not is_gone(pid)]
        for pid in left:  # leave no process behind even when the assertion fails
            os.kill(pid, signal.SIGKILL)
        assert not left, f"still running after their supervisor was killed: {left}"
        assert not run_directory.exists() and not bucket_table.exists()


def test_sigterm_drains_every_process_and_loses_no_accepted_request():
    env = {"MMSERVE_MAX_BATCH_SIZE": "2", "MMSERVE_DRAIN_TIMEOUT_S": "30", "MMSERVE_SYNTHETIC_TEXT_MS": "300",
           "MMSERVE_SYNTHETIC_DISTRIBUTION": "constant", "MMSERVE_CACHE_TEXT_BYTES": "0"}
    with run_serve_process(["--preset", "synthetic", "--device", "cpu", "--api-workers", "2"], env) as served:
        url, process = served.url, served.process
        engine = next(pid for pid in children_of(process.pid) if "engine_process" in command_line(pid))
        run_directory = Path(next(entry.split("=", 1)[1] for entry in Path(f"/proc/{engine}/environ").read_text()
                                  .split("\0") if entry.startswith("MMSERVE_WORKER_RUN_DIR=")))
        assert (run_directory / "engine.sock").exists()

        async def scenario():
            async with httpx.AsyncClient(base_url=url, timeout=60,
                                         limits=httpx.Limits(max_connections=32)) as client:
                accepted = [asyncio.create_task(client.post("/v1/infer", json={"text": f"accepted {i}"}))
                            for i in range(12)]
                # Six batches of 300 ms: after 1 s all twelve have reached the engine (queued or running),
                # even on a busy machine, and the last ones still wait.
                await asyncio.sleep(1.0)
                process.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.1)
                try:
                    ready_after = (await client.get("/health/ready")).status_code
                except httpx.TransportError:
                    ready_after = "refused"
                return await asyncio.gather(*accepted), ready_after

        accepted, ready_status = asyncio.run(scenario())
        assert [r.status_code for r in accepted] == [200] * 12
        assert ready_status in (503, "refused")
        assert process.wait(timeout=60) == 0
        assert not run_directory.exists()  # the socket, snapshots and restart count go with the server


def test_an_api_process_whose_start_up_fails_stops_the_server(tmp_path):
    """Not a restart loop behind a port that looks up: the server exits non-zero, saying why."""
    hooks = str(Path(__file__).parent / "api_workers_hooks")
    process = subprocess.Popen(
        [sys.executable, "-m", "server.cli", "serve", *TINY, "--port", "0"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([hooks, os.environ.get("PYTHONPATH", "")]),
             "MMSERVE_TEST_TOKENIZER_REFUSED": "1", "MMSERVE_LOG_LEVEL": "warning"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == EXIT_API_PROCESS_START_FAILED, output[-3000:]
    assert "before it was ever ready" in output
    assert "build a different tokenizer here" in output  # the API process's own reason, in the log
    assert "starting it again" not in output
