"""How many API processes ``mmserve serve`` runs when ``--api-workers`` is not given.

Measured with ``benchmarks/frontend.py`` (BENCHMARKS.md, history: its runs of 2026-12-03/04):
on 2 CPUs, two API processes answered 1.08-1.17x the text requests/s of one
process at 1.45-1.6x its CPU per request: the engine, the IPC and the load
share the same two cores, and the split's own cost (a frame each way, the
engine's event loop) eats most of the gain. Split by process, a request
costs the one engine process about 0.5 ms of CPU (text) to 1.0 ms (image),
and the API process that answered it 1.2 ms (text) to 3.2 ms (image): one
engine core keeps up with about 2.3 (text) to 3.2 (image) API processes, so
beyond three the engine, not the front end, is what saturates.

Later, with the inference routes called past FastAPI's per-request layers
and wrk at 64 connections, two API processes answered 1.37-1.65x the text
requests/s of one on 2 CPUs, at 1.22-1.48x its CPU per request (at 16
connections 1.22x; 0.95-1.17x in the earlier runs), and 1.54-1.75x once the
API processes ran at nice 5 (``api_process_nice``); 1.25-1.41x once the
synthetic text tower stopped slowing one process down (BENCHMARKS.md,
history). Two CPUs still default
to one process: the gain shows only with many clients at once, each request
costs a fifth to a half more CPU, an API process holds about 800 MiB, and
with ``--device auto`` the choice would cost every start on 2 CPUs a torch
probe. Hence:

    a CPU device                 1    the model's compute wants every core; an API process would take them
    an accelerator, <= 2 CPUs    1    measured above: the split pays on two cores only under many clients
    an accelerator, C CPUs       min(C - 1, 3)   one core for the engine, API processes up to what it can feed

"CPUs" are the ones this process may run on (its affinity) within its
cgroup's CPU quota (``cpu.max``: a container's limit), whichever is fewer.

With ``--device auto`` on more than two CPUs the device decides, and only torch
knows whether it sees a GPU; it is asked in a short-lived child process, so the
supervisor of API processes never holds torch (about 500 MiB resident) for the
server's whole life, at the cost of one torch import (a second or two) at start.
A probe that fails (torch missing or broken, the child killed or past
``PROBE_TIMEOUT_S``) ends start-up with one line naming the flags that skip it
(``DeviceProbeError``, printed by the CLI), not a traceback.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
from pathlib import Path

MAX_DEFAULT_API_WORKERS = 3
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
PROBE_TIMEOUT_S = 300.0  # a first CUDA initialisation can take minutes on a cold node
PROBE = "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')"


class DeviceProbeError(Exception):
    """The child process that asks torch for the device failed; the message is one line for the operator."""


def cpus_in_quota(cpu_max: str) -> float | None:
    """The CPUs a cgroup v2 ``cpu.max`` (``"QUOTA PERIOD"`` or ``"max PERIOD"``) allows; ``None`` for no limit."""
    quota, _, period = cpu_max.strip().partition(" ")
    if quota == "max" or not period:
        return None
    return int(quota) / int(period)


def usable_cpus() -> int:
    """CPUs this process may use: its affinity, capped by its cgroup's quota (rounded up), at least 1."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota = cpus_in_quota(CGROUP_CPU_MAX.read_text())
    except (OSError, ValueError):
        quota = None
    if quota is not None:
        count = min(count, math.ceil(quota))
    return max(count, 1)


def default_api_workers(num_cpus: int, device_type: str) -> int:
    """The rule of this module's docstring."""
    if device_type == "cpu" or num_cpus <= 2:
        return 1
    return min(num_cpus - 1, MAX_DEFAULT_API_WORKERS)


def api_workers_for(device: str) -> int:
    """``--api-workers`` when not given, for the ``device`` setting, logged with what it was chosen from."""
    num_cpus = usable_cpus()
    if device == "auto":  # on <= 2 CPUs the answer is 1 whatever the device: no need to ask torch
        device = "cpu" if num_cpus <= 2 else torch_device_in_subprocess()  # cuda unseen: loading says so
    count = default_api_workers(num_cpus, device)
    logging.getLogger(__name__).info("--api-workers not given: %d for %d usable CPUs and device %s "
                                     "(server/workers/default_count.py)", count, num_cpus, device)
    return count


def torch_device_in_subprocess() -> str:
    """``cuda`` if torch sees a GPU from this environment, else ``cpu``; asked in a child process (docstring).

    Raises ``DeviceProbeError`` when the child fails, times out or cannot start.
    """
    try:
        answer = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                                timeout=PROBE_TIMEOUT_S, check=True)
    except subprocess.CalledProcessError as e:
        last_line = (e.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise DeviceProbeError(_probe_failed(f"exited with status {e.returncode}: {last_line[0]}")) from e
    except subprocess.TimeoutExpired as e:
        raise DeviceProbeError(_probe_failed(f"gave no answer within {e.timeout:g} s")) from e
    except OSError as e:
        raise DeviceProbeError(_probe_failed(f"could not start: {e}")) from e
    lines = answer.stdout.strip().splitlines()
    if not lines or lines[-1] not in ("cuda", "cpu"):
        raise DeviceProbeError(_probe_failed(f"answered {answer.stdout.strip()[-200:]!r}"))
    return lines[-1]


def _probe_failed(what: str) -> str:
    return (f"--device auto and no --api-workers: the probe that asks torch for the device (to choose the "
            f"number of API processes) {what}; pass --device (cpu or cuda) or --api-workers N to skip it")
