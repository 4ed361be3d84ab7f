"""The soak's per-process readings: a server of several processes is read process by process."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from benchmarks.harness.process_resources import ProcessTreeSampler, child_pids

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, which only Linux has")

PARENT = "import subprocess, sys, time; subprocess.Popen(['sleep', '30']); sys.stdout.write('ok\\n'); " \
         "sys.stdout.flush(); time.sleep(30)"


def test_the_parent_and_its_child_each_get_a_series_of_their_own():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline() == "ok\n"
        deadline = time.monotonic() + 10
        while not child_pids(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        [child] = child_pids(parent.pid)
        with ProcessTreeSampler(parent.pid, interval_s=0.05) as sampler:
            time.sleep(0.3)
        assert set(sampler.series) == {parent.pid, child}
        assert sampler.series[child].label == "sleep"
        for series in sampler.series.values():
            assert len(series.times_s) == len(series.rss_bytes) == len(series.num_fds) >= 3
            assert min(series.rss_bytes) > 0 and min(series.num_fds) >= 1
            assert series.times_s == sorted(series.times_s)
        assert max(sampler.series[parent.pid].rss_bytes) > max(sampler.series[child].rss_bytes)  # python > sleep
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)])
        parent.kill()
        parent.wait()


def test_a_label_read_empty_at_first_sight_is_read_again(monkeypatch):
    """A child seen before its exec (an empty command line) gets its program's name from a later reading."""
    import benchmarks.harness.process_resources as process_resources

    real_label, seen = process_resources.process_label, set()

    def empty_the_first_time(pid: int) -> str:
        if pid not in seen:
            seen.add(pid)
            return ""
        return real_label(pid)

    monkeypatch.setattr(process_resources, "process_label", empty_the_first_time)
    child = subprocess.Popen(["sleep", "30"])
    try:
        with ProcessTreeSampler(child.pid, interval_s=0.05) as sampler:
            time.sleep(0.3)
        assert sampler.series[child.pid].label == "sleep"
        assert len(sampler.series[child.pid].times_s) >= 3
    finally:
        child.kill()
        child.wait()
