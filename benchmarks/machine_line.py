"""One line that says which machine a benchmark ran on, for the head of what it prints.

BENCHMARKS.md keeps each figure with its machine: the CPU model (``lscpu``),
the CPUs this process may use, and the torch and Python that ran it.
"""

from __future__ import annotations

import os
import platform
import subprocess

import torch


def cpu_model_name() -> str:
    """``lscpu``'s model name, or "unknown CPU" where lscpu is missing or says nothing."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown CPU"
    for line in lscpu.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def machine_line() -> str:
    num_cpus = len(os.sched_getaffinity(0))
    return (f"{platform.machine()} {cpu_model_name()}, {num_cpus} CPUs, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads in this process), python {platform.python_version()}")
