"""The garbage-collection benchmark's counting hook and its table."""

from __future__ import annotations

import gc
import json
import threading
import time

from benchmarks.garbage_collection import Run, table
from benchmarks.gc_counting_serve import CollectionCounter, write_totals


def test_the_hook_counts_each_collection_by_generation_with_its_cpu():
    counter = CollectionCounter()
    gc.callbacks.append(counter)
    try:
        gc.collect(0)
        gc.collect(1)
        gc.collect(1)
        gc.collect(2)
    finally:
        gc.callbacks.remove(counter)
    assert counter.collections == [1, 2, 1]
    assert all(spent >= 0 for spent in counter.cpu_s)
    # generations 0 and 2 ran once each: their one collection's CPU is theirs whole, and none is longer than the longest
    assert max(counter.cpu_s[0], counter.cpu_s[2]) <= counter.longest_cpu_s <= sum(counter.cpu_s)


def test_the_writer_publishes_totals_and_starts_the_longest_over_on_reset(tmp_path):
    counter = CollectionCounter()
    counter.collections = [3, 2, 1]
    counter.longest_cpu_s = 0.25
    stats = tmp_path / "gc.json"
    stopped = threading.Event()
    writer = threading.Thread(target=write_totals, args=(counter, stats, stopped), daemon=True)
    writer.start()
    try:
        written = _wait_for(lambda: stats.exists() and json.loads(stats.read_text()))
        assert written["collections"] == [3, 2, 1] and written["longest_cpu_s"] == 0.25
        assert written["threshold"] == list(gc.get_threshold())
        (tmp_path / "gc.json.reset").touch()
        assert _wait_for(lambda: json.loads(stats.read_text())["longest_cpu_s"] == 0.0)
        assert not (tmp_path / "gc.json.reset").exists()
    finally:
        stopped.set()
        writer.join(5)
    assert not writer.is_alive()


def test_the_table_pools_each_thresholds_runs():
    runs = [Run(700, answered=1000, seconds=1.0, server_cpu_s=0.9, collections=[100, 10, 1],
                collection_cpu_s=0.045, longest_cpu_s=0.002),
            Run(700, answered=1000, seconds=1.0, server_cpu_s=1.1, collections=[120, 12, 1],
                collection_cpu_s=0.055, longest_cpu_s=0.003),
            Run(10_000, answered=1200, seconds=1.0, server_cpu_s=0.84, collections=[0, 0, 0],
                collection_cpu_s=0.0, longest_cpu_s=0.0)]
    header, default, raised = (line.split() for line in table(runs, [700, 10_000]))
    assert header[:2] == ["young", "threshold"]
    # 2000 answers in 2 s; 2.0 CPU s over 2000 answers; 110 young, 11 middle, 1 full collections a second;
    # 0.1 GC CPU s over 2000 answers, 5 % of the server's CPU; the longer run's longest collection.
    assert default == ["700", "1000", "1.000", "110.0", "11.0", "1.0", "0.0500", "5.0", "%", "3.00"]
    assert raised == ["10000", "1200", "0.700", "0.0", "0.0", "0.0", "0.0000", "0.0", "%", "0.00"]


def _wait_for(condition, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = condition()
        except (OSError, ValueError):
            value = None
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("not within the time allowed")
