"""The harness's wrk runner: its report read right, its bodies written and posted in turn, its runs alternated.

The runs use real ``wrk`` against ``tests/http_sink.py`` processes (real
HTTP servers that count the requests and bytes they received), so what wrk
says it sent can be held to what a server got.
"""

from __future__ import annotations

import httpx
import pytest

from benchmarks.harness import (
    AlternationPlan, RunSpec, ServerProcess, WrkReport, paused_servers, resumed, run_alternated,
    run_saturation, run_wrk, running, saturation_order, wrk_saturation, write_bodies,
)
from benchmarks.harness.wrk_load import SCRIPT_NAME, parse_wrk_report, wrk_argv, wrk_seconds
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.workload import parse_mix
from http_sink import sink_command
from tests.conftest import find_wrk_binary


def _received(url: str) -> tuple[int, int]:
    stats = httpx.get(url + "/stats", timeout=5.0, trust_env=False).json()
    return stats["requests"], stats["bytes"]


def test_failures_are_counted_by_kind_and_zeros_left_out():
    assert WrkReport(100, 3, 2, 1.0).errors_by_kind() == {"non-2xx": 3, "socket": 2}
    assert WrkReport(100, 0, 4, 1.0).errors_by_kind() == {"socket": 4}
    assert WrkReport(100, 0, 0, 1.0).errors_by_kind() == {}


def test_a_report_in_microseconds_or_hours_gives_seconds():
    assert parse_wrk_report("  5 requests in 900.00us, 1KB read\n").duration_s == pytest.approx(9e-4)
    assert parse_wrk_report("  7200 requests in 1.00h, 1MB read\n").ok_rps == pytest.approx(2.0)


def test_wrk_runs_one_thread_for_whole_seconds():
    assert [wrk_seconds(s) for s in (0.2, 1.4, 1.6, 8.0)] == [1, 1, 2, 8]


def test_the_command_line_is_one_thread_the_connections_and_the_script(tmp_path):
    bodies = write_bodies(tmp_path, "text", "/v1/embeddings", [b"{}"])
    argv = wrk_argv("/usr/bin/wrk", "http://127.0.0.1:9", bodies, seconds=2.6, connections=16, timeout_s=60.0)
    assert argv == ["/usr/bin/wrk", "-t1", "-c16", "-d3s", "--timeout", "60s", "-s", str(tmp_path / SCRIPT_NAME),
                    "http://127.0.0.1:9"]


def test_bodies_are_written_in_order_beside_the_script(tmp_path):
    bodies = write_bodies(tmp_path / "image" / "mmserve", "image", "/v1/embeddings", [b'{"a": 1}', b'{"b": 2}'])
    assert bodies.path == "/v1/embeddings"
    assert [file.read_bytes() for file in bodies.files] == [b'{"a": 1}', b'{"b": 2}']
    assert [file.name for file in bodies.files] == ["image-0.json", "image-1.json"]
    assert bodies.script.read_text().startswith("-- Posts the bodies named in BODY_FILES")
    with pytest.raises(ValueError, match="at least one body"):
        write_bodies(tmp_path, "none", "/v1/embeddings", [])


def test_one_body_is_posted_every_time_and_wrk_counts_what_the_server_answered(tmp_path):
    find_wrk_binary()
    body = b'{"input": ["' + b"x" * 90 + b'"]}'
    bodies = write_bodies(tmp_path, "text", "/v1/traces", [body])
    with running(sink_command(), ready_timeout_s=30.0) as sink:
        before_requests, before_bytes = _received(sink.url)
        report = run_wrk(sink.url, bodies, seconds=1.0, connections=2)
        after_requests, after_bytes = _received(sink.url)
    num_requests, num_bytes = after_requests - before_requests, after_bytes - before_bytes
    assert report.num_responses > 0 and report.num_non_2xx == 0 and report.num_socket_errors == 0
    # wrk stops with at most one request in flight per connection: received, never counted as answered.
    assert report.num_responses <= num_requests <= report.num_responses + 2
    assert num_bytes == len(body) * num_requests
    assert 0.5 < report.duration_s < 3.0


def test_several_bodies_are_posted_in_turn(tmp_path):
    find_wrk_binary()
    short, long = b'{"input": ["' + b"s" * 85 + b'"]}', b'{"input": ["' + b"l" * 285 + b'"]}'
    assert (len(short), len(long)) == (100, 300)
    bodies = write_bodies(tmp_path, "text", "/v1/traces", [short, long])
    with running(sink_command(), ready_timeout_s=30.0) as sink:
        before = _received(sink.url)
        report = run_wrk(sink.url, bodies, seconds=1.0, connections=2)
        after = _received(sink.url)
    num_requests, num_bytes = after[0] - before[0], after[1] - before[1]
    assert report.num_ok > 0
    num_long, remainder = divmod(num_bytes - 100 * num_requests, 200)
    assert remainder == 0  # every request carried one of the two bodies, whole
    num_short = num_requests - num_long
    # Sent strictly in turn; the server got all but at most one in flight per connection.
    assert num_short > 0 and num_long > 0 and abs(num_short - num_long) <= 1 + 2


def test_wrk_saturation_runs_alternate_and_count_the_servers_cpu_per_answer(tmp_path):
    find_wrk_binary()
    bodies = {name: write_bodies(tmp_path / name, "text", "/v1/traces", [b"{}", b'{"k": 1}']) for name in "ab"}
    plan = AlternationPlan(seconds=1.0, num_rounds=2, warmup_s=1.0, concurrency=2)
    with paused_servers({"a": sink_command(), "b": sink_command()}, ready_timeout_s=30.0) as servers:
        before = {name: _paused_count(server) for name, server in servers.items()}
        runs = run_saturation(servers, ["a", "b"], plan, wrk_saturation(lambda run: bodies[run.name]), "sinks")
        after = {name: _paused_count(server) for name, server in servers.items()}
    for name in "ab":
        server_runs = runs[name]
        assert len(server_runs.throughputs_rps) == 2 and min(server_runs.throughputs_rps) > 0
        assert server_runs.errors == {}
        assert server_runs.has_cpu and server_runs.cpu_ms_per_request > 0
        assert 0 < server_runs.server_cores <= 2.5
        # Two measured runs plus the warm-up reached the server; only the measured answers are pooled.
        assert sum(server_runs.saturation_num_ok) < after[name] - before[name]
    assert saturation_order(["a", "b"], 0) == ("a", "b") and saturation_order(["a", "b"], 1) == ("b", "a")


def _paused_count(server: ServerProcess) -> int:
    """The requests a paused sink received so far (resumed to answer, paused again)."""
    with resumed(server):
        return _received(server.url)[0]


def test_with_wrk_saturating_the_python_generator_only_runs_the_fixed_rate(tmp_path):
    find_wrk_binary()
    bodies = {name: write_bodies(tmp_path / name, "text", "/v1/traces", [b"{}"]) for name in ("peer", "ours")}
    plan = AlternationPlan(seconds=1.0, num_rounds=2, warmup_s=1.0, concurrency=2, fixed_rate_share=0.05)
    asked: list[RunSpec] = []

    def config_for(run: RunSpec) -> BenchConfig:
        asked.append(run)
        return run.config(mix=parse_mix("text:1"), timeout_s=5.0)

    with paused_servers({"peer": sink_command(), "ours": sink_command()}, ready_timeout_s=30.0) as servers:
        runs = run_alternated(servers, "peer", "ours", plan, config_for, "sinks",
                              saturate=wrk_saturation(lambda run: bodies[run.name]))
    assert [(run.name, run.mode) for run in asked] == [("ours", RunMode.OPEN), ("peer", RunMode.OPEN),
                                                      ("peer", RunMode.OPEN), ("ours", RunMode.OPEN)]
    assert [run.rate_rps for run in asked] == [pytest.approx(0.05 * runs["peer"].throughput_rps)] * 4
    for name in ("peer", "ours"):
        assert len(runs[name].saturation_cpu_s) == 2 and runs[name].cpu_ms_per_request > 0
        assert len(runs[name].other_cpus) == 4  # two saturation runs, two fixed-rate runs
