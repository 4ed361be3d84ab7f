"""How many engines a server runs, and each one's settings: ``--engines``, ``--devices`` and the CPU's cores.

    --devices cuda:0,cuda:1      one engine per device; each sees only its own GPU (CUDA_VISIBLE_DEVICES=N),
                                 so to itself it is ``cuda`` (device 0), and nothing in the engine changes
    --engines auto               one engine per GPU torch sees (asked in a child process, as
                                 ``server.workers.default_count`` asks for the device); one on the CPU
    --engines N                  N engines on ``--device``
    compute threads, on the CPU  unset: the usable CPUs divided among the engines (at least 1 each), so N
                                 engines do not each start a pool as wide as the machine and fight for it

More than one engine always runs the supervisor and API processes in front
(``server.cli``): only an API process can send each request to one of them.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

from server.settings import Settings
from server.workers.default_count import PROBE_TIMEOUT_S, DeviceProbeError, usable_cpus

GPU_COUNT_PROBE = "import torch; print(torch.cuda.device_count())"


@dataclass(frozen=True)
class EnginePlan:
    """One engine: its settings and what its environment adds (the GPU it sees)."""

    index: int
    settings: Settings
    environment: dict[str, str]


def num_engines(settings: Settings) -> int:
    """The engines ``settings`` ask for (``--engines auto`` on CUDA asks torch, in a child process)."""
    if settings.devices is not None:
        return len(settings.devices)
    if settings.engines != "auto":
        return int(settings.engines)
    if settings.device == "cpu":
        return 1
    return max(1, visible_gpus())


def engine_plans(settings: Settings, count: int | None = None) -> list[EnginePlan]:
    """Each engine's settings: its device, and on the CPU its share of the cores unless ``compute_threads`` is set."""
    count = num_engines(settings) if count is None else count
    plans = []
    for index in range(count):
        device = settings.devices[index] if settings.devices is not None else None
        update: dict[str, object] = {"engines": count, "devices": None}
        environment: dict[str, str] = {}
        if device is not None:
            update["device"] = "cpu" if device == "cpu" else "cuda"
            if device != "cpu":
                environment["CUDA_VISIBLE_DEVICES"] = device.removeprefix("cuda:")
        elif settings.engines == "auto" and settings.device != "cpu" and count > 1:
            environment["CUDA_VISIBLE_DEVICES"] = str(index)  # one per visible GPU
        on_gpu = update.get("device", settings.device) == "cuda" or "CUDA_VISIBLE_DEVICES" in environment
        if count > 1 and settings.compute_threads is None and not on_gpu:
            update["compute_threads"] = max(1, usable_cpus() // count)
        plans.append(EnginePlan(index, settings.model_copy(update=update), environment))
    return plans


def visible_gpus() -> int:
    """GPUs torch sees from this environment, asked in a child process (this one stays free of torch)."""
    try:
        answer = subprocess.run([sys.executable, "-c", GPU_COUNT_PROBE], capture_output=True, text=True,
                                timeout=PROBE_TIMEOUT_S, check=True)
        return int(answer.stdout.strip().splitlines()[-1])
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError, ValueError, IndexError) as e:
        raise DeviceProbeError(f"--engines auto: the probe that asks torch how many GPUs it sees failed "
                               f"({type(e).__name__}); pass --engines N or --devices cuda:0,cuda:1") from e
