"""``mmserve bench`` and ``mmserve quantiles`` as a user runs them: exit codes, one-line errors, a closed stdout.

Exit codes are a contract with scripts, so they are checked on the real command line, in a subprocess:
0 measured, 1 the run could not start (no request reached the server, a bad key file), 2 a usage error
(argparse's own code, kept for every flag the load generator refuses), 3 mostly errors.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.loadgen.cli import main
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.report import build_report, format_table
from benchmarks.loadgen.request_spec import Modality
from benchmarks.loadgen.runner import OUTCOME_CLIENT_TIMEOUT, RunResult, Sample
from clients.api_key_file import ApiKeyFileError, read_api_key

_REPO_ROOT = Path(__file__).resolve().parents[3]
_DIGEST_LINE = "sha256:" + "ab" * 32
_LOAD = ["--rate", "5", "--duration", "1", "--no-progress"]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_all(commands: list[list[str]]) -> list[subprocess.CompletedProcess[str]]:
    """``python -m server.cli COMMAND`` for each command, all at once (each pays the import)."""
    processes = [
        subprocess.Popen([sys.executable, "-m", "server.cli", *command], cwd=_REPO_ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for command in commands
    ]
    done = []
    for command, process in zip(commands, processes):
        out, err = process.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(command, process.returncode, out, err))
    return done


@pytest.fixture
def unreachable_url() -> str:
    return f"http://127.0.0.1:{_closed_port()}"


def _assert_one_line_exits(results: list[subprocess.CompletedProcess[str]], code: int) -> None:
    for result in results:
        assert result.returncode == code, (result.args, result.returncode, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (result.args, result.stderr)
        assert "Traceback" not in result.stderr and result.stdout == "", (result.args, result.stdout)


def test_bench_usage_errors_exit_2_in_one_line(unreachable_url: str) -> None:
    url = unreachable_url
    results = _run_all([
        ["bench", url, "--rate", "5"],
        ["bench", url, "--rate", "-1", "--duration", "1"],
        ["bench", url, "--rate", "0", "--duration", "1"],
        ["bench", url, "--rate", "5", "--duration", "0"],
        ["bench", url, *_LOAD[:4], "--mix", "foo:1"],
        ["bench", url, *_LOAD[:4], "--text-chars", "40:8"],
        ["bench", url, *_LOAD[:4], "--image-size", "0x0"],
        ["bench", url, *_LOAD[:4], "--zipf", "-1"],
        ["bench", url, *_LOAD[:4], "--timeout-s", "0"],
        ["bench", "notaurl", *_LOAD[:4]],
        ["bench", url, "--duration", "1"],
    ])
    _assert_one_line_exits(results, 2)
    assert "an open-loop run needs --duration" in results[0].stderr


def test_quantiles_refuses_bad_urls_a_replica_twice_and_bad_timeouts(unreachable_url: str) -> None:
    url = unreachable_url
    results = _run_all([
        ["quantiles", "notaurl"],
        ["quantiles", url, "--timeout-s", "0"],
        ["quantiles", url, "--timeout-s", "-1"],
        ["quantiles", url, url.removeprefix("http://") + "/"],
    ])
    _assert_one_line_exits(results, 2)
    assert "same replica" in results[-1].stderr


def test_bench_that_cannot_start_exits_1_in_one_line_without_a_table(unreachable_url: str, tmp_path: Path) -> None:
    digest_file = tmp_path / "server-keys"
    digest_file.write_text(f"# made by mmserve hash-key\n{_DIGEST_LINE}\n")
    results = _run_all([
        ["bench", unreachable_url, *_LOAD],
        ["bench", "http://nonexistent.invalid:8000", *_LOAD],
        ["bench", unreachable_url, *_LOAD, "--api-key-file", str(digest_file)],
    ])
    _assert_one_line_exits(results, 1)
    assert all("no request reached the server" in result.stderr for result in results[:2])
    assert "digest" in results[-1].stderr and _DIGEST_LINE not in results[-1].stderr


def test_a_key_file_of_digests_is_refused_not_sent(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"{_DIGEST_LINE.upper().replace('SHA256', 'sha256')}\nplain-key\n")
    with pytest.raises(ApiKeyFileError, match="not a key a client can send"):
        read_api_key(path)
    path.write_text("# a client's key\nplain-key\n")
    assert read_api_key(path) == "plain-key"


def test_a_reader_that_stops_early_gets_no_traceback(standin: Any) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "server.cli", "bench", standin.url, "--rate", "20", "--duration", "0.5",
         "--mix", "text:1", "--no-progress"],
        cwd=_REPO_ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # as `| head -0`: the table meets a closed pipe
    err = process.stderr.read()
    assert process.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_queue_waits_cover_the_answers_the_server_folds_after_the_run(
    start_standin: Any, tmp_path: Path
) -> None:
    """The server's stage times reach /metrics only at its next fold: a short run must wait for it."""
    server = start_standin(fold_delay_s=0.8)
    output = tmp_path / "run.json"
    assert main([server.url, "--rate", "40", "--duration", "0.4", "--mix", "text:1", "--no-progress",
                 "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    queue_wait = report["server"]["queue_wait"]
    assert queue_wait is not None, report["server"]
    assert sum(entry["count"] for entry in queue_wait.values()) == report["ok"] > 0, queue_wait
    assert all(entry["mean_ms"] is not None for entry in queue_wait.values())


def test_a_run_nothing_answered_says_so_rather_than_a_last_answer_time() -> None:
    config = BenchConfig(url="http://127.0.0.1:9", mode=RunMode.OPEN, duration_s=1.0, rate_rps=2.0)
    samples = tuple(
        Sample(Modality.TEXT, "text", intended_s=t, sent_s=t, done_s=t + 0.5, status=0, outcome=OUTCOME_CLIENT_TIMEOUT)
        for t in (0.1, 0.6)
    )
    report = build_report(config, RunResult(samples, started_at_s=0.0, schedule_window_s=1.0), {})
    assert report["last_answer_s"] is None
    assert "none answered" in format_table(report) and "last answer at" not in format_table(report)
    answered = (*samples, Sample(Modality.TEXT, "text", 0.2, 0.2, 0.45, 200, "ok"))
    report = build_report(config, RunResult(answered, started_at_s=0.0, schedule_window_s=1.0), {})
    assert report["last_answer_s"] == pytest.approx(0.45)
    assert "last answer at 0.45 s" in format_table(report)
