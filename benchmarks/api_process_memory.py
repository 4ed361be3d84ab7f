"""Memory of an API process after it has served, and how soon one that was killed is back.

    python -m benchmarks.api_process_memory [--rounds 12]

For each model (the ``tiny`` preset, and a random SigLIP written with
transformers' constructors and ``save_pretrained`` at 384 px), a server runs
with ``--api-workers 2 --device cpu``. Text, image (JPEG and PNG, decoded and
resized to the model's input) and fused requests are sent, each on a new
connection so both API processes take some; then each API process's memory is
read from ``/proc/<pid>/status``:

    counted     VmRSS - RssShmem: what the process holds of its own (target <= 200 MiB)
    shm         RssShmem: the pixel slots the process and the engine share (reported, not counted)

and whether it maps libtorch. For comparison, the same figure for the engine
(which holds the model) and for a bare Python process that imports torch,
transformers and timm (what each API process imported before it went
torch-free).

Restart: one API process is killed with SIGKILL and the other stopped
(SIGSTOP, so only the new one accepts). Timed from the moment the
supervisor's new child is first seen (backoff before the spawn not counted)
to its readiness mark (``<run dir>/ready/<pid>``) and to its first answer
(``GET /health/live``), target <= 1 s. Repeated ``--restarts`` times.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from benchmarks.harness.figures import Figure, add_save_figures_argument, save_figures

MIB = 1024 * 1024
RSS_TARGET_MIB = 200.0
RESTART_TARGET_S = 1.0
RUN_DIRECTORY_VARIABLE = "MMSERVE_WORKER_RUN_DIR"  # what the supervisor hands its children (server.workers.handoff)


@dataclass(frozen=True)
class Served:
    process: subprocess.Popen
    url: str

    def children(self, kind: str) -> set[int]:
        pid = self.process.pid
        found = set()
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            try:
                if kind in Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace"):
                    found.add(int(child))
            except FileNotFoundError:  # exited meanwhile
                pass
        return found


@contextmanager
def serve(args: Sequence[str]) -> Iterator[Served]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", *args, "--port", str(port)],
                               env={**os.environ, "MMSERVE_LOG_LEVEL": "warning"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"mmserve serve {' '.join(args)} exited with {process.returncode}")
            try:
                if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server never became ready")
            time.sleep(0.1)
        yield Served(process, url)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _encoded(seed: int, size: tuple[int, int], image_format: str) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=image_format)
    return base64.b64encode(out.getvalue()).decode()


TEXTS = ("a photo of a cat", "Two DOGS playing on the grass!", "東京タワーの夜景 🗼", "word " * 80)


def send_traffic(url: str, rounds: int) -> int:
    """``rounds`` x (text, JPEG, PNG, fused) on new connections; every answer must be 200. Returns how many."""
    sent = 0
    for i in range(rounds):
        jpeg = {"b64": _encoded(i, (640, 480), "JPEG")}
        png = {"b64": _encoded(1000 + i, (384, 384), "PNG")}
        bodies = ({"text": TEXTS[i % len(TEXTS)], "truncate": True}, {"image": jpeg}, {"image": png},
                  {"image": jpeg, "text": TEXTS[(i + 1) % len(TEXTS)], "truncate": True})
        for body in bodies:
            answer = httpx.post(f"{url}/v1/infer", json={**body, "use_cache": False},
                                headers={"Connection": "close"}, timeout=120)
            if answer.status_code != 200:
                raise RuntimeError(f"{answer.status_code}: {answer.text[:300]}")
            sent += 1
    return sent


def memory_mib(pid: int) -> tuple[float, float, bool]:
    """(VmRSS - RssShmem, RssShmem) in MiB, and whether the process maps libtorch."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssShmem"):
            fields[name] = int(value.split()[0]) * 1024
    maps_torch = "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    return (fields["VmRSS"] - fields["RssShmem"]) / MIB, fields["RssShmem"] / MIB, maps_torch


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


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has spent so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_restart(served: Served) -> tuple[float, float, float]:
    """Seconds from a killed API process's successor being seen to its readiness mark, and to its first
    answer; and the CPU seconds it had spent by its first answer (its own start's cost, whatever the load)."""
    killed, survivor = sorted(served.children("api_process"))
    ready_directory = _run_directory(survivor) / "ready"
    os.kill(survivor, signal.SIGSTOP)  # only the new process accepts connections
    try:
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not (new := served.children("api_process") - {killed, survivor}):
            if time.monotonic() > deadline:
                raise RuntimeError("the supervisor started no API process in the killed one's place")
            time.sleep(0.002)
        seen = time.perf_counter()
        (restarted,) = new
        with httpx.Client(timeout=60) as client:  # connects now; the listen queue holds it until one accepts
            answered = client.get(f"{served.url}/health/live", headers={"Connection": "close"})
        answered_s = time.perf_counter() - seen
        spent_s = cpu_s(restarted)
        if answered.status_code != 200:
            raise RuntimeError(f"/health/live answered {answered.status_code}")
        while not (ready_directory / str(restarted)).exists():
            if time.perf_counter() - seen > 60:
                raise RuntimeError("the restarted API process never marked itself ready")
            time.sleep(0.002)
        mark_s = (ready_directory / str(restarted)).stat().st_mtime - (time.time() - (time.perf_counter() - seen))
        return mark_s, answered_s, spent_s
    finally:
        os.kill(survivor, signal.SIGCONT)


def write_siglip_384(directory: Path) -> Path:
    from benchmarks.random_pretrained import TowerSize, write_siglip

    return write_siglip(directory, TowerSize(image_size=384, patch_size=32), max_text_tokens=64)


def measure(name: str, args: Sequence[str], rounds: int, restarts: int) -> list[list[str]]:
    rows = []
    with serve([*args, "--device", "cpu", "--api-workers", "2"]) as served:
        sent = send_traffic(served.url, rounds)
        for pid in sorted(served.children("api_process")):
            counted, shm, maps_torch = memory_mib(pid)
            verdict = "met" if counted <= RSS_TARGET_MIB and not maps_torch else "NOT met"
            rows.append([name, f"API process {pid} after {sent} requests", f"{counted:.1f}",
                         f"{shm:.1f}", "yes" if maps_torch else "no", f"<= {RSS_TARGET_MIB:.0f} MiB: {verdict}"])
        (engine,) = served.children("engine_process")
        counted, shm, maps_torch = memory_mib(engine)
        rows.append([name, "engine (holds the model)", f"{counted:.1f}", f"{shm:.1f}",
                     "yes" if maps_torch else "no", "-"])
        for attempt in range(restarts):
            mark_s, answered_s, spent_s = time_restart(served)
            verdict = "met" if max(mark_s, answered_s) <= RESTART_TARGET_S else "NOT met"
            rows.append([name, f"restart {attempt + 1}: spawn -> ready mark / first answer (CPU by then)",
                         f"{mark_s:.3f} s / {answered_s:.3f} s ({spent_s:.2f} s)", "", "",
                         f"<= {RESTART_TARGET_S:.0f} s: {verdict}"])
            send_traffic(served.url, 1)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=12, help="rounds of (text, JPEG, PNG, fused) before measuring")
    parser.add_argument("--restarts", type=int, default=3, help="API processes killed and timed, per model")
    add_save_figures_argument(parser)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mmserve-bench-") as directory:
        siglip = write_siglip_384(Path(directory) / "siglip-384")
        for name, model_args in (("tiny", ["--preset", "tiny"]), ("siglip 384 px", ["--model", str(siglip)])):
            rows.extend(measure(name, model_args, args.rounds, args.restarts))
    rows.append(["-", "bare python: import torch, transformers, timm", f"{old_import_set_mib():.1f}", "", "yes",
                 "what an API process imported before"])
    print(table(["model", "process", "RSS - shm (MiB)", "shm: pixel slots (MiB)", "maps libtorch", "target"], rows))
    save_figures(args.save_figures, headline_figures(rows))
    return 0


def headline_figures(rows: list[list[str]]) -> list[Figure]:
    """The largest API process's own RSS and the quickest restart to a first answer, as the table printed them."""
    rss = [float(row[2]) for row in rows if row[1].startswith("API process ")]
    restarts = [float(row[2].split(" / ")[1].split(" s")[0]) for row in rows if row[1].startswith("restart ")]
    return ([Figure("api_process_memory", "API process RSS - shm after serving, max", max(rss), "MiB")] * bool(rss)
            + [Figure("api_process_memory", "restart, spawn to first answer, best", min(restarts), "s")] * bool(restarts))


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Plain columns, as wide as their widest cell."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [headers, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
