"""``--api-workers`` when not given: the rule measured in BENCHMARKS.md, and the CPUs it counts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import server.workers.default_count as default_count
from server.cli import main
from server.workers.default_count import (
    MAX_DEFAULT_API_WORKERS,
    DeviceProbeError,
    cpus_in_quota,
    default_api_workers,
    torch_device_in_subprocess,
    usable_cpus,
)


@pytest.mark.parametrize(("num_cpus", "device", "expected"), [
    (1, "cpu", 1), (2, "cpu", 1), (64, "cpu", 1),   # a CPU model's compute wants every core
    (1, "cuda", 1), (2, "cuda", 1),                  # two API processes on 2 CPUs: 1.17x for 1.45x the CPU
    (3, "cuda", 2), (4, "cuda", 3), (16, "cuda", MAX_DEFAULT_API_WORKERS),  # one core for the engine, up to 3
])
def test_the_default_follows_the_cpus_and_the_device(num_cpus, device, expected):
    assert default_api_workers(num_cpus, device) == expected


def test_a_cgroup_quota_counts_in_cpus_and_max_is_no_limit():
    assert cpus_in_quota("max 100000\n") is None
    assert cpus_in_quota("150000 100000\n") == pytest.approx(1.5)
    assert cpus_in_quota("200000 100000") == pytest.approx(2.0)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_usable_cpus_follow_the_affinity_of_the_process():
    """A process pinned to one CPU counts one, whatever the machine has."""
    code = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); " \
           "from server.workers.default_count import usable_cpus; print(usable_cpus())"
    pinned = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == "1"
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))


def test_the_device_probe_answers_what_torch_sees_here():
    """The supervisor asks a child process; its answer is the one torch gives in this process."""
    assert torch_device_in_subprocess() == ("cuda" if torch.cuda.is_available() else "cpu")


FAILING_PROBES = {
    "exits non-zero": dict(PROBE="import sys; sys.exit('torch cannot load libcudart here')"),
    "times out": dict(PROBE="import time; time.sleep(30)", PROBE_TIMEOUT_S=0.5),
}


@pytest.mark.parametrize("failure", [*FAILING_PROBES, "cannot start"])
def test_a_failing_probe_is_one_line_naming_the_flags_that_skip_it(failure, monkeypatch, capsys):
    """``mmserve serve`` on a machine of 8 CPUs (this path never runs on 2) whose device probe fails:
    exit 2 and one line on stderr, not a traceback."""
    monkeypatch.delenv("MMSERVE_API_WORKERS", raising=False)
    monkeypatch.delenv("MMSERVE_DEVICE", raising=False)
    monkeypatch.setattr(default_count, "usable_cpus", lambda: 8)
    for name, value in FAILING_PROBES.get(failure, {}).items():
        monkeypatch.setattr(default_count, name, value)
    if failure == "cannot start":
        monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    assert main(["serve", "--preset", "tiny", "--device", "auto", "--port", "0"]) == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1, error
    assert "--device" in error and "--api-workers" in error
    assert "Traceback" not in error
    if failure == "exits non-zero":
        assert "torch cannot load libcudart here" in error  # the child's own last line


def test_a_probe_that_answers_nonsense_is_refused(monkeypatch):
    monkeypatch.setattr(default_count, "PROBE", "print('tpu')")
    with pytest.raises(DeviceProbeError, match="--api-workers"):
        torch_device_in_subprocess()
