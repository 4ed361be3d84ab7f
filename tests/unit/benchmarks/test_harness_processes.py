"""The harness with real processes: servers start in turn and pause, runs alternate A-B-B-A, CPU is counted.

The servers here are ``tests/http_sink.py`` processes: real HTTP servers
started by the same commands and process groups a benchmark uses, small
enough to start in a fraction of a second. They answer every POST with 200,
so the load generator's runs against them succeed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from benchmarks.harness import (
    AlternationPlan, CpuMeter, RunSpec, ServerCommand, ServerStartError, capacity_rps,
    paused_servers, resumed, run_alternated, run_report, running, start_paused,
)
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.workload import parse_mix
from http_sink import sink_command


def _state(pid: int) -> str:
    """The process's state letter from /proc (``T``: stopped by a signal)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def _settled_state(pid: int, timeout_s: float = 5.0) -> str:
    """The state once a signal sent just now has landed (SIGSTOP and SIGCONT are delivered asynchronously)."""
    deadline_s = time.monotonic() + timeout_s
    state = _state(pid)
    while time.monotonic() < deadline_s:
        time.sleep(0.05)
        state, previous = _state(pid), state
        if state == previous and state != "R":
            break
    return state


def _is_alive(pid: int) -> bool:
    try:
        return _state(pid) != "Z"
    except FileNotFoundError:
        return False


def test_servers_start_paused_run_only_when_resumed_and_are_all_stopped_after():
    commands = {"a": sink_command(), "b": sink_command()}
    with paused_servers(commands, ready_timeout_s=30.0) as servers:
        pids = {name: server.pid for name, server in servers.items()}
        assert list(servers) == ["a", "b"]
        assert {_settled_state(pid) for pid in pids.values()} == {"T"}
        with resumed(servers["b"]) as server:
            assert httpx.get(server.url + "/stats", timeout=5.0, trust_env=False).status_code == 200
            assert _settled_state(pids["b"]) != "T" and _settled_state(pids["a"]) == "T"
        assert _settled_state(pids["b"]) == "T"
    assert not any(_is_alive(pid) for pid in pids.values())


def test_a_server_that_dies_at_start_up_says_why_and_leaves_nothing_behind():
    argv = (sys.executable, "-c", "import sys; sys.stderr.write('ValueError: no model here\\n'); sys.exit(3)")
    with pytest.raises(ServerStartError) as raised:
        start_paused(ServerCommand("broken", argv, 1, "/health"), ready_timeout_s=30.0)
    assert "broken exited with 3 during start-up" in str(raised.value)
    assert raised.value.stderr_tail.strip() == "ValueError: no model here"


def test_the_cpu_meter_counts_the_server_it_measures():
    server = start_paused(sink_command(), ready_timeout_s=30.0)
    try:
        with resumed(server):
            meter = CpuMeter(server)
            with httpx.Client(base_url=server.url, timeout=5.0, trust_env=False) as client:
                for _ in range(400):
                    client.post("/v1/traces", content=b"x" * 2048)
            spent = meter.stop()
    finally:
        server.stop()
    assert spent.server_s > 0.0
    assert spent.ours_s >= spent.server_s  # ours: this generator and every server
    assert spent.other_cpus >= 0.0 and spent.wall_s > 0.0
    assert spent.server_ms_per_request(400) == pytest.approx(1000.0 * spent.server_s / 400)


def test_a_generator_run_as_a_child_counts_as_ours_not_as_another_process():
    server = start_paused(sink_command(), ready_timeout_s=30.0)
    try:
        meter = CpuMeter(server)
        busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
        subprocess.run([sys.executable, "-c", busy], check=True)  # waited for, as wrk is
        spent = meter.stop()
    finally:
        server.stop()
    assert spent.ours_s >= 0.3  # the child's 0.3 s of CPU, however busy the machine was meanwhile


def test_an_alternated_comparison_runs_warm_ups_then_a_b_b_a_saturation_then_b_a_a_b_at_the_fixed_rate():
    plan = AlternationPlan(seconds=0.4, num_rounds=2, warmup_s=0.2, concurrency=2, fixed_rate_share=0.5)
    asked: list[RunSpec] = []

    def config_for(run: RunSpec) -> BenchConfig:
        asked.append(run)
        return run.config(mix=parse_mix("text:1"), timeout_s=5.0)

    commands = {"peer": sink_command(), "ours": sink_command()}
    with paused_servers(commands, ready_timeout_s=30.0) as servers:
        urls = {name: server.url for name, server in servers.items()}
        runs = run_alternated(servers, "peer", "ours", plan, config_for, "sinks")

    assert [(run.name, run.mode, run.seconds, run.seed) for run in asked] == [
        ("peer", RunMode.CLOSED, 0.2, 99), ("ours", RunMode.CLOSED, 0.2, 99),
        ("peer", RunMode.CLOSED, 0.4, 0), ("ours", RunMode.CLOSED, 0.4, 0),
        ("ours", RunMode.CLOSED, 0.4, 1), ("peer", RunMode.CLOSED, 0.4, 1),
        ("ours", RunMode.OPEN, 0.4, 100), ("peer", RunMode.OPEN, 0.4, 100),
        ("peer", RunMode.OPEN, 0.4, 101), ("ours", RunMode.OPEN, 0.4, 101),
    ]
    assert all(run.url == urls[run.name] for run in asked)
    assert {run.concurrency for run in asked if run.mode is RunMode.CLOSED} == {2}
    fixed_rates = [run.rate_rps for run in asked if run.mode is RunMode.OPEN]
    assert fixed_rates == [pytest.approx(0.5 * runs["peer"].throughput_rps)] * 4  # a share of the peer's mean
    for name in ("peer", "ours"):
        assert len(runs[name].throughputs_rps) == 2 and min(runs[name].throughputs_rps) > 0
        assert len(runs[name].other_cpus) == 4  # two saturation runs, two fixed-rate runs
        assert runs[name].open_num_ok == runs[name].open_num_sent > 0
        assert runs[name].errors == {}


def test_a_run_reports_what_the_server_received_and_capacity_counts_its_answers():
    with running(sink_command(), ready_timeout_s=30.0) as sink:
        def received() -> int:
            return httpx.get(sink.url + "/stats", timeout=5.0, trust_env=False).json()["requests"]

        before = received()
        report = run_report(BenchConfig(url=sink.url, mode=RunMode.OPEN, duration_s=0.5, rate_rps=40.0,
                                        mix=parse_mix("text:1"), seed=3, timeout_s=5.0, show_progress=False))
        assert report["sent"] == report["ok"] == received() - before > 0
        assert capacity_rps(sink.url, mix="text:1", duration_s=0.5, concurrency=2) > 0


def test_a_kinds_main_thread_is_read_apart_from_its_other_threads(tmp_path):
    """A child labelled ``burner.py`` spins 0.4 s in a second thread while its main thread sleeps: the kind's CPU
    holds the spin, its main thread's share does not (the engine's event loop against its compute threads)."""
    from benchmarks.harness.cpu_accounting import cpu_by_process_kind

    script = tmp_path / "burner.py"
    script.write_text("import threading, time\n"
                      "def spin():\n    end = time.thread_time() + 0.4\n    while time.thread_time() < end: pass\n"
                      "worker = threading.Thread(target=spin)\nworker.start()\nworker.join()\n"
                      "print('spun', flush=True)\ntime.sleep(30)\n")
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "spun\n"  # the spin is over; the process lives on, asleep
        by_kind = cpu_by_process_kind(os.getpid(), main_thread_of=("burner.py",))
    finally:
        child.kill()
        child.wait()
    assert by_kind["burner.py"] >= 0.35
    assert by_kind["burner.py main thread"] < 0.5 * by_kind["burner.py"]  # start-up only: the spin ran elsewhere
    assert "supervisor" in by_kind  # this test's own process, the root
