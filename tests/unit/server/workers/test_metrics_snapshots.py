"""Snapshots on request: another process writes its counts when a scrape connects to it, and only then."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from server.workers.metrics_snapshots import fresh_snapshots, request_socket_path, snapshot_path

# A process that answers snapshot requests; its gauge holds its wall clock, set every 10 ms.
ANSWERING_PROCESS = textwrap.dedent("""
    import asyncio, sys, threading, time
    from prometheus_client import CollectorRegistry, Gauge, Histogram
    from server.workers.metrics_snapshots import answer_snapshot_requests

    registry = CollectorRegistry()
    clock = Gauge("process_clock_seconds", "wall clock", registry=registry)
    histogram = Histogram("request_seconds", "durations", registry=registry)

    def tick():
        while True:
            clock.set(time.time())
            time.sleep(0.01)

    threading.Thread(target=tick, daemon=True).start()
    asyncio.run(answer_snapshot_requests(sys.argv[1], registry, histogram))
""")


def _clock_of(snapshot: dict) -> float:
    family = next(f for f in text_string_to_metric_families(snapshot["text"]) if f.name == "process_clock_seconds")
    return family.samples[0].value


@pytest.fixture
def answering(tmp_path: Path) -> Iterator[subprocess.Popen]:
    process = subprocess.Popen([sys.executable, "-c", ANSWERING_PROCESS, str(tmp_path)],
                               env={**os.environ, "PYTHONPATH": os.getcwd()})
    deadline = time.monotonic() + 60
    while not snapshot_path(str(tmp_path), process.pid).exists():  # the one written at start
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    yield process
    process.kill()
    process.wait()


def test_a_scrape_reads_counts_written_after_it_asked(tmp_path: Path, answering: subprocess.Popen) -> None:
    time.sleep(0.5)
    asked_at = time.time()
    snapshots = fresh_snapshots(str(tmp_path))
    assert list(snapshots) == [answering.pid]
    # Written after the ask (the gauge ticks every 10 ms), not the snapshot written at start, 0.5 s before.
    assert _clock_of(snapshots[answering.pid]) >= asked_at - 0.05


def test_no_snapshot_is_written_unless_asked(tmp_path: Path, answering: subprocess.Popen) -> None:
    path = snapshot_path(str(tmp_path), answering.pid)
    written_at = path.stat().st_mtime_ns
    time.sleep(1.0)
    assert path.stat().st_mtime_ns == written_at
    fresh_snapshots(str(tmp_path))
    assert path.stat().st_mtime_ns > written_at


def test_a_process_that_does_not_answer_is_read_as_it_last_wrote(tmp_path: Path,
                                                                answering: subprocess.Popen) -> None:
    started_clock = _clock_of(fresh_snapshots(str(tmp_path))[answering.pid])
    os.kill(answering.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        snapshots = fresh_snapshots(str(tmp_path), wait_s=0.5)
        waited_s = time.monotonic() - started
    finally:
        os.kill(answering.pid, signal.SIGCONT)
    assert 0.5 <= waited_s < 2.0
    assert _clock_of(snapshots[answering.pid]) == started_clock


def test_a_process_gone_without_clean_up_is_left_out_at_once(tmp_path: Path, answering: subprocess.Popen) -> None:
    """SIGKILL leaves its socket and snapshot behind: the connection is refused, no scrape waits for it."""
    os.kill(answering.pid, signal.SIGKILL)
    answering.wait()
    assert request_socket_path(str(tmp_path), answering.pid).exists()
    started = time.monotonic()
    assert fresh_snapshots(str(tmp_path), wait_s=5.0) == {}
    assert time.monotonic() - started < 1.0


def test_scrapes_at_once_each_get_a_snapshot_written_after_they_asked(tmp_path: Path,
                                                                     answering: subprocess.Popen) -> None:
    time.sleep(0.3)
    asked_at = time.time()
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: fresh_snapshots(str(tmp_path)), range(4)))
    assert all(_clock_of(snapshots[answering.pid]) >= asked_at - 0.05 for snapshots in answers)
