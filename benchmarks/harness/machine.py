"""The machine and date line at the head of what a benchmark prints: CPU model, usable CPUs, torch, Python."""

from __future__ import annotations

import os
import platform
import subprocess
import time


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


def utc_now() -> str:
    """The time a benchmark started, as every header prints it: ``2026-12-03 08:09 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def num_usable_cpus() -> int:
    """The CPUs this process may run on (its affinity), which its servers share with it."""
    return len(os.sched_getaffinity(0))


def machine_line() -> str:
    """Architecture, CPU model, CPUs this process may use, torch (and its threads) and Python."""
    import torch  # here, not at import: the harness is imported by benchmarks that never load a model

    return (f"{platform.machine()} {cpu_model_name()}, {num_usable_cpus()} CPUs, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads in this process), python {platform.python_version()}")
