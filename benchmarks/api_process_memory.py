"""Memory of an API process after it has served, and how soon one that was killed is back, forked or spawned.

    python -m benchmarks.api_process_memory [--rounds 12] [--restarts 3]

Per model (the ``tiny`` preset; a random 384-px SigLIP) two servers with
``--api-workers 2 --device cpu``, one per ``MMSERVE_API_PROCESS_START``:
``spawn`` (a new interpreter) and ``forkserver`` (a fork of the fork server,
``server/workers/api_forkserver.py``; the default). After text, JPEG, PNG and
fused requests, each on a new connection, each API process's memory from
``/proc/<pid>/status`` and ``smaps_rollup``:

    counted     VmRSS - RssShmem: what the process holds of its own (target <= 200 MiB)
    PSS         Pss - Pss_Shmem: the same with each shared page divided among its sharers
    shm         RssShmem: the pixel slots shared with the engine (reported, not counted)

and whether it maps libtorch; beside them the engine, the fork server and a
bare Python that imports torch, transformers and timm.

Restart: one API process SIGKILLed, the other SIGSTOPped (so only the new one
accepts), ``--restarts`` times per server. Timed from the new process's start
(``/proc/<pid>/stat``; the supervisor's 0.5 s backoff before it not counted)
to its readiness mark and to its first answer (``GET /health/live``), target
<= 1 s, with its CPU by then; the last column times from the kill, less the
backoff.
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.harness import ServerProcess, mmserve_command, mmserve_model_command, ruled, running
from benchmarks.harness.cpu_accounting import process_cpu_s, process_start_s
from benchmarks.harness.figures import Figure, add_save_figures_argument, save_figures
from benchmarks.harness.process_resources import child_pids, process_label
from benchmarks.photo_like import noise_image

MIB = 1024 * 1024
RSS_TARGET_MIB = 200.0
RESTART_TARGET_S = 1.0
RUN_DIRECTORY_VARIABLE = "MMSERVE_WORKER_RUN_DIR"  # what the supervisor hands its children (server.workers.handoff)
START_METHODS = ("spawn", "forkserver")  # MMSERVE_API_PROCESS_START; alternated, the old way first
PILLOW_JPEG_QUALITY = 75  # Pillow's default, which these JPEGs were first written at
BACKOFF_S = 0.5  # the supervisor's first wait before it starts a dead API process again (restart_backoff)


def children(server: ServerProcess, label: str) -> set[int]:
    """The server's direct children that run ``label`` (``api_process``, ``api_forkserver``, ``engine_process``)."""
    return {pid for pid in child_pids(server.pid) if process_label(pid) == label}


TEXTS = ("a photo of a cat", "Two DOGS playing on the grass!", "東京タワーの夜景 🗼", "word " * 80)


def send_traffic(url: str, rounds: int) -> int:
    """``rounds`` x (text, JPEG, PNG, fused) on new connections; every answer must be 200. Returns how many."""
    sent = 0
    for i in range(rounds):
        jpeg = {"b64": base64.b64encode(noise_image(640, 480, i, quality=PILLOW_JPEG_QUALITY)).decode()}
        png = {"b64": base64.b64encode(noise_image(384, 384, 1000 + i, "PNG")).decode()}
        bodies = ({"text": TEXTS[i % len(TEXTS)], "truncate": True}, {"image": jpeg}, {"image": png},
                  {"image": jpeg, "text": TEXTS[(i + 1) % len(TEXTS)], "truncate": True})
        for body in bodies:
            answer = httpx.post(f"{url}/v1/infer", json={**body, "use_cache": False},
                                headers={"Connection": "close"}, timeout=120)
            if answer.status_code != 200:
                raise RuntimeError(f"{answer.status_code}: {answer.text[:300]}")
            sent += 1
    return sent


def memory_mib(pid: int) -> tuple[float, float, float, bool]:
    """(VmRSS - RssShmem, Pss - Pss_Shmem, RssShmem) in MiB, and whether the process maps libtorch."""
    fields = {}
    for path in (f"/proc/{pid}/status", f"/proc/{pid}/smaps_rollup"):
        for line in Path(path).read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssShmem", "Pss", "Pss_Shmem"):
                fields[name] = int(value.split()[0]) * 1024
    maps_torch = "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    return ((fields["VmRSS"] - fields["RssShmem"]) / MIB, (fields["Pss"] - fields.get("Pss_Shmem", 0)) / MIB,
            fields["RssShmem"] / MIB, maps_torch)


def old_import_set_mib() -> float:
    """RSS of a bare process after ``import torch, transformers, timm`` (what API processes imported before)."""
    code = ("import torch, transformers, timm, pathlib; s = pathlib.Path('/proc/self/status').read_text();"
            "print(int(s.split('VmRSS:')[1].split()[0]))")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout) / 1024


def _run_directory(pid: int) -> Path:
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if entry.startswith(RUN_DIRECTORY_VARIABLE.encode() + b"="):
            return Path(entry.split(b"=", 1)[1].decode())
    raise RuntimeError(f"process {pid} has no {RUN_DIRECTORY_VARIABLE}")


def boot_clock_s() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class Restart:
    """One killed API process's successor, in seconds."""

    to_mark_s: float  # from its start to its readiness mark
    to_answer_s: float  # from its start to its first answer
    cpu_s: float  # CPU it had spent by its first answer
    kill_to_answer_s: float  # from the kill to its first answer, less the supervisor's backoff


def time_restart(served: ServerProcess) -> Restart:
    """Kill one API process and time the one started in its place (the other is stopped meanwhile)."""
    killed, survivor = sorted(children(served, "api_process"))
    ready_directory = _run_directory(survivor) / "ready"
    os.kill(survivor, signal.SIGSTOP)  # only the new process accepts connections
    try:
        killed_at = boot_clock_s()
        os.kill(killed, signal.SIGKILL)
        while not (new := children(served, "api_process") - {killed, survivor}):
            if boot_clock_s() - killed_at > 60:
                raise RuntimeError("the supervisor started no API process in the killed one's place")
            time.sleep(0.002)
        (restarted,) = new
        with httpx.Client(timeout=60) as client:  # connects now; the listen queue holds it until one accepts
            answered = client.get(f"{served.url}/health/live", headers={"Connection": "close"})
        answered_at = boot_clock_s()
        spent_s = process_cpu_s(restarted)
        if answered.status_code != 200:
            raise RuntimeError(f"/health/live answered {answered.status_code}")
        mark = ready_directory / str(restarted)
        while not mark.exists():
            if boot_clock_s() - answered_at > 60:
                raise RuntimeError("the restarted API process never marked itself ready")
            time.sleep(0.002)
        marked_at = mark.stat().st_mtime - (time.time() - boot_clock_s())  # wall clock -> boot clock
        spawned_at = process_start_s(restarted)
        return Restart(marked_at - spawned_at, answered_at - spawned_at, spent_s,
                       answered_at - killed_at - BACKOFF_S)
    finally:
        os.kill(survivor, signal.SIGCONT)


def write_siglip_384(directory: Path) -> Path:
    from benchmarks.random_pretrained import TowerSize, write_siglip

    return write_siglip(directory, TowerSize(image_size=384, patch_size=32), max_text_tokens=64)


def memory_rows(name: str, method: str, served: ServerProcess, sent: int) -> list[list[str]]:
    rows = []
    for pid in sorted(children(served, "api_process")):
        counted, pss, shm, maps_torch = memory_mib(pid)
        verdict = "met" if counted <= RSS_TARGET_MIB and not maps_torch else "NOT met"
        rows.append([name, method, f"API process {pid} after {sent} requests", f"{counted:.1f}", f"{pss:.1f}",
                     f"{shm:.1f}", "yes" if maps_torch else "no", f"<= {RSS_TARGET_MIB:.0f} MiB: {verdict}"])
    for kind, what in (("api_forkserver", "fork server (imports, forks)"), ("engine_process", "engine (holds the model)")):
        for pid in children(served, kind):
            counted, pss, shm, maps_torch = memory_mib(pid)
            rows.append([name, method, what, f"{counted:.1f}", f"{pss:.1f}", f"{shm:.1f}",
                         "yes" if maps_torch else "no", "-"])
    return rows


def measure(name: str, model: str | Path, rounds: int, restarts: int) -> tuple[list[list[str]], list[list[str]],
                                                                                   dict[str, list[Restart]]]:
    """Memory rows and restart rows of one model (a preset or a directory), each way of starting API processes."""
    memory, timed = [], []
    by_method: dict[str, list[Restart]] = {method: [] for method in START_METHODS}
    with ExitStack() as stack:
        servers = {}
        for method in START_METHODS:
            settings = {"API_WORKERS": "2", "API_PROCESS_START": method}
            command = (mmserve_model_command(model, settings) if isinstance(model, Path)
                       else mmserve_command(model, settings))
            servers[method] = stack.enter_context(running(command))
        for method, served in servers.items():
            memory.extend(memory_rows(name, method, served, send_traffic(served.url, rounds)))
        for attempt in range(restarts):
            for method, served in servers.items():  # alternated: both meet the same load
                restart = time_restart(served)
                by_method[method].append(restart)
                verdict = "met" if max(restart.to_mark_s, restart.to_answer_s) <= RESTART_TARGET_S else "NOT met"
                timed.append([name, method, str(attempt + 1), f"{restart.to_mark_s:.3f}", f"{restart.to_answer_s:.3f}",
                              f"{restart.cpu_s:.2f}", f"{restart.kill_to_answer_s:.3f}",
                              f"<= {RESTART_TARGET_S:.0f} s: {verdict}"])
                send_traffic(served.url, 1)
    return memory, timed, by_method


def summary_rows(name: str, by_method: dict[str, list[Restart]]) -> list[list[str]]:
    rows = []
    for method, restarts in by_method.items():
        answers = sorted(restart.to_answer_s for restart in restarts)
        cpu = sorted(restart.cpu_s for restart in restarts)
        rows.append([name, method, f"{answers[0]:.3f}-{answers[-1]:.3f}", f"{answers[len(answers) // 2]:.3f}",
                     f"{cpu[0]:.2f}-{cpu[-1]:.2f}",
                     "met" if answers[-1] <= RESTART_TARGET_S else "NOT met"])
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=12, help="rounds of (text, JPEG, PNG, fused) before measuring")
    parser.add_argument("--restarts", type=int, default=3, help="API processes killed and timed, per model and way")
    add_save_figures_argument(parser)
    args = parser.parse_args(argv)
    memory, timed, summary = [], [], []
    with tempfile.TemporaryDirectory(prefix="mmserve-bench-") as directory:
        siglip = write_siglip_384(Path(directory) / "siglip-384")
        for name, model in (("tiny", "tiny"), ("siglip 384 px", siglip)):
            model_memory, model_timed, by_method = measure(name, model, args.rounds, args.restarts)
            memory.extend(model_memory)
            timed.extend(model_timed)
            summary.extend(summary_rows(name, by_method))
    memory.append(["-", "-", "bare python: import torch, transformers, timm", f"{old_import_set_mib():.1f}", "", "",
                   "yes", "what an API process imported before"])
    print(ruled([["model", "start", "process", "RSS - shm (MiB)", "PSS - shm (MiB)", "shm: pixel slots (MiB)",
                  "maps libtorch", "target"], *memory], is_left_aligned=True))
    print()
    print(ruled([["model", "start", "restart", "start -> ready mark (s)", "start -> first answer (s)",
                  "CPU by then (s)", "kill -> first answer - backoff (s)", "target"], *timed], is_left_aligned=True))
    print()
    print(ruled([["model", "start", "start -> first answer (s)", "median (s)", "CPU by then (s)",
                  f"<= {RESTART_TARGET_S:.0f} s"], *summary], is_left_aligned=True))
    save_figures(args.save_figures, headline_figures(memory, summary))
    return 0


def headline_figures(memory: list[list[str]], summary: list[list[str]]) -> list[Figure]:
    """The largest API process's own RSS and the slowest forked restart to a first answer, as the tables printed them."""
    rss = [float(row[3]) for row in memory if row[2].startswith("API process ")]
    forked = [float(row[2].split("-")[-1]) for row in summary if row[1] == "forkserver"]
    return ([Figure("api_process_memory", "API process RSS - shm after serving, max", max(rss), "MiB")] * bool(rss)
            + [Figure("api_process_memory", "forked restart, spawn to first answer, worst", max(forked), "s")]
            * bool(forked))


if __name__ == "__main__":
    sys.exit(main())
