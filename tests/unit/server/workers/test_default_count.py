"""``--api-workers`` when not given: the rule measured in BENCHMARKS.md, and the CPUs it counts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from server.workers.default_count import (
    MAX_DEFAULT_API_WORKERS,
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
