"""``--api-workers 2`` under faults: a killed API process, a crash loop, a killed supervisor, SIGTERM; idle CPU.
(An engine's death and an engines' crash loop: test_engines_faults.)"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from encoded_images import b64, encoded_image
from server.workers.handoff import RATE_BUCKETS_VARIABLE, RUN_DIRECTORY_VARIABLE
from server.workers.metrics_snapshots import fresh_snapshots
from server.workers.supervisor import EXIT_API_CRASH_LOOP, EXIT_API_PROCESS_START_FAILED
from tests.conftest import ServeProcess, run_serve_process
from tests.integration.counter_series import counter_series, text_requests, went_down

pytestmark = pytest.mark.long  # minutes together: started first (tests/conftest.py)

TINY = ["--preset", "tiny", "--device", "cpu", "--api-workers", "2"]
# Per API process over 10 s idle. Wake-ups are what a clock costs, and they do not grow with the load of a
# shared machine the way CPU time does: measured 147-210 now (uvicorn's 0.1 s tick and the engine's status
# poll every 0.2 s), 391-437 when each process also scanned its run directory every 50 ms (200 more).
IDLE_WAKEUPS_BUDGET = 300
IDLE_CPU_BUDGET_MS = 100.0  # 1 % of a core; measured about 28 ms on a quiet machine, 30-50 ms beside a test run


def children_of(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def restarts(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return float(re.search(r"^mmserve_api_worker_restarts_total (\S+)$", text, re.M).group(1))


def live_api_processes(url: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Connection": "close"}, timeout=10).text
    return float(re.search(r"^mmserve_api_workers_live (\S+)$", text, re.M).group(1))


def api_processes_of(supervisor_pid: int) -> list[int]:
    return [pid for pid in children_of(supervisor_pid) if "api_process" in command_line(pid)]


def voluntary_switches(pid: int) -> int:
    """Times every thread of ``pid`` went to sleep so far (each one a wake-up later): ``/proc/PID/task/*/status``."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += next(int(line.split()[1]) for line in status.splitlines()
                      if line.startswith("voluntary_ctxt_switches:"))
    return total


def cpu_time_s(pid: int) -> float:
    """CPU time of every thread of ``pid`` so far (``/proc/PID/task/*/schedstat``: nanoseconds, not ticks)."""
    total_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total_ns += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total_ns / 1e9


# Far above what any test here sends from its one address (the load test's four threads included): no 429, but a
# shared bucket table the killed supervisor leaves behind (test_the_children_exit_when_the_supervisor_is_killed).
UNREACHED_RATE_LIMIT = "100000/s"


@pytest.fixture(scope="module")
def tiny_workers() -> Iterator[ServeProcess]:
    """One ``--api-workers 2`` tiny server (with a rate limit nobody reaches) for the tests below: idle first, then
    those that kill an API process and wait until its successor serves, and last the one that kills its supervisor
    (one start fewer than a server of its own for that test)."""
    with run_serve_process(TINY, {"MMSERVE_RATE_LIMIT": UNREACHED_RATE_LIMIT}) as served:
        yield served


def test_an_idle_unscraped_api_process_spends_no_cpu_on_a_clock(tiny_workers):
    """No scan for scrape requests: what is left is the engine's status poll (every 0.2 s) and uvicorn's
    0.1 s tick, about 28 ms per 10 s here, against 68-72 ms when each process scanned its run directory
    every 50 ms."""
    api_pids = api_processes_of(tiny_workers.process.pid)
    assert len(api_pids) == 2
    time.sleep(2.0)  # start-up settled (nothing of this test touches the server from here on)
    before = {pid: (cpu_time_s(pid), voluntary_switches(pid)) for pid in api_pids}
    time.sleep(10.0)
    spent_ms = {pid: round((cpu_time_s(pid) - before[pid][0]) * 1000, 1) for pid in api_pids}
    wakeups = {pid: voluntary_switches(pid) - before[pid][1] for pid in api_pids}
    assert all(count < IDLE_WAKEUPS_BUDGET for count in wakeups.values()), wakeups
    assert all(ms < IDLE_CPU_BUDGET_MS for ms in spent_ms.values()), spent_ms
    # And a scrape still gathers both processes (each answers with a snapshot written now).
    assert restarts(tiny_workers.url) == 0
    assert live_api_processes(tiny_workers.url) == 2


def test_a_killed_api_process_loses_only_its_requests_and_the_server_stays_ready(tiny_workers):
    url, supervisor = tiny_workers.url, tiny_workers.process
    assert restarts(url) == 0
    api_pids = api_processes_of(supervisor.pid)
    assert len(api_pids) == 2
    answered, dropped, other = [], [], []
    ready_statuses: list[int | str] = []
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

    def probe_readiness() -> None:  # as a load balancer would, every 50 ms, each probe on a new connection
        while not stop.is_set():
            try:
                ready_statuses.append(httpx.get(f"{url}/health/ready", headers={"Connection": "close"},
                                                timeout=5).status_code)
            except httpx.TransportError:
                ready_statuses.append("dropped")
            time.sleep(0.05)

    threads = [threading.Thread(target=load) for _ in range(4)] + [threading.Thread(target=probe_readiness)]
    for thread in threads:
        thread.start()
    live_seen = []
    try:
        time.sleep(1.0)
        flowing_by = time.monotonic() + 60  # answers flow before the kill, however busy the machine is
        while not answered and time.monotonic() < flowing_by:
            time.sleep(0.1)
        answered_before = len(answered)
        os.kill(api_pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 180  # an API process imports for seconds; more on a loaded machine
        while True:  # until the process started in its place serves
            live_seen.append(live_api_processes(url))
            current = api_processes_of(supervisor.pid)
            if live_seen[-1] == 2 and len(current) == 2 and api_pids[0] not in current and restarts(url) == 1:
                break
            assert time.monotonic() < deadline, f"the killed API process was not started again: {live_seen}"
            time.sleep(0.1)
        answered_meanwhile = len(answered)
        time.sleep(1.0)
        probed_by = time.monotonic() + 30  # a forked successor serves within a second: probe on after it too
        while len(ready_statuses) < 20 and time.monotonic() < probed_by:
            time.sleep(0.1)
    finally:  # the load stops whatever failed, or this test process never ends
        stop.set()
        for thread in threads:
            thread.join()
    assert answered_before > 0
    assert answered_meanwhile > answered_before, "the other API process kept answering"
    # Ready throughout: the probe reached the process still serving. At most the one probe in flight on
    # the killed process when it died lost its connection (a kubelet needs 3 failed probes in a row).
    assert len(ready_statuses) >= 20
    assert set(ready_statuses) <= {200, "dropped"} and ready_statuses.count("dropped") <= 1, ready_statuses
    # Degraded meanwhile, and the gauge says so: 1 while the other starts again, then 2.
    assert 1 in live_seen and live_seen[-1] == 2, live_seen
    assert live_seen.index(1) < len(live_seen) - 1
    assert other == [], f"no error answers, only dropped connections: {other}"
    assert len(dropped) <= 4, "only the killed process's in-flight requests are lost"
    assert supervisor.poll() is None
    assert restarts(url) == 1


def environment_block(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def kill_one_and_ask_its_successor(served: ServeProcess) -> tuple[int, list[int]]:
    """SIGKILL one API process, wait for the one started in its place to serve, and send it (alone: the other
    is stopped meanwhile) a text and an image request on new connections; the successor's pid, and the
    statuses it answered."""
    supervisor = served.process.pid
    killed, survivor = sorted(api_processes_of(supervisor))
    restarts_before = restarts(served.url)
    created = httpx.get(f"{served.url}/v1/models").json()["data"][0]["created"]
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + 180  # a new interpreter imports for seconds, more on a loaded machine
    while True:
        successors = set(api_processes_of(supervisor)) - {killed, survivor}
        if successors and live_api_processes(served.url) == 2 and restarts(served.url) == restarts_before + 1:
            break
        assert time.monotonic() < deadline, "the killed API process was not started again"
        time.sleep(0.05)
    (successor,) = successors
    image = {"b64": b64(encoded_image(5, (64, 48), "JPEG"))}
    os.kill(survivor, signal.SIGSTOP)  # only the successor accepts connections now
    try:
        statuses = [httpx.post(f"{served.url}/v1/infer", json=body, headers={"Connection": "close"},
                               timeout=60).status_code for body in ({"text": "after a restart"}, {"image": image})]
        # OpenAI's model "created" is the server's start, not the successor's: one model, one value, whoever answers
        models = httpx.get(f"{served.url}/v1/models", headers={"Connection": "close"}, timeout=60).json()
        assert models["data"][0]["created"] == created
    finally:
        os.kill(survivor, signal.SIGCONT)
    return successor, statuses


def test_a_killed_api_process_is_forked_again_by_the_fork_server_and_answers(tiny_workers):
    """The successor is a fork of the fork server (it has the fork server's own environment block, which the
    supervisor gave one variable more), handed to the supervisor as its child, named as an API process."""
    supervisor = tiny_workers.process.pid
    (fork_server,) = [pid for pid in children_of(supervisor) if "api_forkserver" in command_line(pid)]
    (engine,) = [pid for pid in children_of(supervisor) if "engine_process" in command_line(pid)]
    successor, statuses = kill_one_and_ask_its_successor(tiny_workers)
    assert statuses == [200, 200]
    assert parent_of(successor) == supervisor and successor not in children_of(fork_server)
    listening_fd = command_line(fork_server).split()[4]  # python -m server.workers.api_forkserver CONTROL LISTENING
    assert command_line(successor).split()[1:] == ["-m", "server.workers.api_process", listening_fd]
    assert environment_block(successor) == environment_block(fork_server) != environment_block(engine)
    assert parent_of(fork_server) == supervisor  # the same fork server, still there for the next one


def test_no_counter_goes_down_when_an_api_process_is_killed_and_started_again(tiny_workers):
    """/metrics sums every API process's counters; the killed one's last counts stay in the sum (Prometheus
    reads a decrease as a counter reset: a false spike in every rate()), and the requests answered after the
    restart are counted on top of them. Every counter series of the scrape is compared, not a chosen one."""
    url, supervisor = tiny_workers.url, tiny_workers.process.pid
    api_pids = api_processes_of(supervisor)
    for number in range(12):  # new connections: both API processes answer some
        answer = httpx.post(f"{url}/v1/infer", json={"text": f"counted {number}"}, headers={"Connection": "close"},
                            timeout=60)
        assert answer.status_code == 200, answer.text
    before = counter_series(url)
    run_directory = environment_entry(api_pids[0], RUN_DIRECTORY_VARIABLE)
    counted = {pid: text_requests(series_of(snapshot["text"]))
               for pid, snapshot in fresh_snapshots(run_directory).items()}
    killed = max(api_pids, key=lambda pid: counted.get(pid, 0.0))
    assert counted[killed] > 0, counted  # the kill takes counts away from a plain sum of the live processes
    restarts_before = restarts(url)
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + 180  # a successor imports for seconds, more on a loaded machine
    while not (live_api_processes(url) == 2 and restarts(url) == restarts_before + 1
               and killed not in api_processes_of(supervisor)):
        assert time.monotonic() < deadline, "the killed API process was not started again"
        time.sleep(0.1)
    after = [counter_series(url) for _ in range(4)]  # new connections: the successor answers some
    for scrape in after:
        assert went_down(before, scrape) == {}
        assert text_requests(scrape) == text_requests(before)
    for number in range(6):
        answer = httpx.post(f"{url}/v1/infer", json={"text": f"after {number}"}, headers={"Connection": "close"},
                            timeout=60)
        assert answer.status_code == 200, answer.text
    later = counter_series(url)
    assert went_down(after[-1], later) == {}
    assert text_requests(later) == text_requests(before) + 6, "the answers after the restart counted on top"


def series_of(text: str) -> dict:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_with_spawn_a_killed_api_process_is_a_new_interpreter_and_answers(serve_process):
    """``api_process_start: spawn``: no fork server; each API process is ``python -m server.workers.api_process``."""
    with serve_process(TINY, {"MMSERVE_API_PROCESS_START": "spawn"}) as served:
        supervisor = served.process.pid
        assert not [pid for pid in children_of(supervisor) if "api_forkserver" in command_line(pid)]
        successor, statuses = kill_one_and_ask_its_successor(served)
        assert statuses == [200, 200]
        assert parent_of(successor) == supervisor
        (sibling,) = [pid for pid in api_processes_of(supervisor) if pid != successor]
        assert environment_block(successor) == environment_block(sibling)  # the supervisor's, as given at exec


def test_a_crash_loop_stops_the_server_with_its_own_exit_status(tmp_path):
    """API processes that die at every start: started again after 0.5, 1, 2 and 4 s, then the fifth death
    within a minute stops the server with EXIT_API_CRASH_LOOP and one line saying so."""
    crash_file = tmp_path / "crash-at-start"
    hooks = str(Path(__file__).parent / "api_workers_hooks")
    env = {"PYTHONPATH": os.pathsep.join([hooks, os.environ.get("PYTHONPATH", "")]),
           "MMSERVE_TEST_API_CRASH_FILE": str(crash_file)}
    with run_serve_process(TINY, env) as served:
        url, supervisor = served.url, served.process
        api_pids = api_processes_of(supervisor.pid)
        crash_file.touch()  # from now on every API process started exits at once
        killed_at = time.monotonic()
        os.kill(api_pids[0], signal.SIGKILL)
        time.sleep(2.0)  # between the second and the third start again
        ready_meanwhile = httpx.get(f"{url}/health/ready", headers={"Connection": "close"}).status_code
        live_meanwhile = live_api_processes(url)
        restarts_meanwhile = restarts(url)
        status = supervisor.wait(timeout=120)
        stopped_after_s = time.monotonic() - killed_at
        output = supervisor.stdout.read()
    assert status == EXIT_API_CRASH_LOOP, output[-3000:]
    assert ready_meanwhile == 200 and live_meanwhile == 1 and restarts_meanwhile >= 1
    crash_loop_lines = [line for line in output.splitlines() if "crash loop" in line]
    assert len(crash_loop_lines) == 1 and "CRITICAL" in crash_loop_lines[0], output[-3000:]
    assert re.findall(r"starting it again in (\S+) s", output) == ["0.5", "1.0", "2.0", "4.0"]
    assert stopped_after_s >= 0.5 + 1 + 2 + 4
    assert is_gone(api_pids[1])


def is_gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def environment_entry(pid: int, name: str) -> str:
    return next(entry.split("=", 1)[1] for entry in Path(f"/proc/{pid}/environ").read_text().split("\0")
                if entry.startswith(f"{name}="))


def test_the_children_exit_when_the_supervisor_is_killed(tiny_workers):
    """A supervisor killed with SIGKILL runs no clean-up: the engine and API processes must notice alone,
    and remove what it would have: the run directory and the shared rate-limit table.

    The last test of ``tiny_workers`` (it ends the server); its API processes were killed and started again
    before, so their successors notice too. An engine's death: test_engines_faults."""
    supervisor = tiny_workers.process
    children = children_of(supervisor.pid)
    assert len(children) == 4  # the engine, the API processes' fork server and two API processes
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
        assert (run_directory / "engine-0.sock").exists()

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


def test_ctrl_c_to_the_whole_process_group_drains_as_one_signal_to_the_supervisor():
    """Ctrl+C in a terminal signals the foreground process group, every process of the server at once. The
    children are the supervisor's to stop, in its order (API processes drain, then the engines): the group's
    signal is the same drain as one to the supervisor alone, exit 0, no ERROR and no traceback. It used to
    exit 241 (an engine's -15) with ERROR lines from engines and API processes stopping on their own."""
    args = [*TINY, "--engines", "2", "--enable-fault-injection"]
    with run_serve_process(args, {"MMSERVE_DRAIN_TIMEOUT_S": "30"}, start_new_session=True) as served:
        url, process = served.url, served.process
        deadline = time.monotonic() + 120  # ready is one engine serving: the drill waits for both
        while (drill := httpx.post(f"{url}/v1/admin/faults", json={"stage": "text", "delay_ms": 1500,
                                                                     "duration_s": 60}, timeout=30)).status_code == 503:
            assert time.monotonic() < deadline, drill.text
            time.sleep(0.2)
        assert drill.status_code == 200, drill.text  # on every engine: the request is in flight at the signal
        answers: list[httpx.Response] = []
        in_flight = threading.Thread(target=lambda: answers.append(
            httpx.post(f"{url}/v1/infer", json={"text": "in flight at ctrl+c"}, timeout=60)))
        in_flight.start()
        time.sleep(0.5)
        os.killpg(process.pid, signal.SIGINT)
        in_flight.join(60)
        assert process.wait(timeout=60) == 0, process.stdout.read()[-5000:]
        output = process.stdout.read()
    assert [answer.status_code for answer in answers] == [200]
    assert "ERROR" not in output and "Traceback" not in output, output[-5000:]


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
