"""Start-up time: from spawning ``mmserve serve`` to ``/health/ready``, by runtime and export cache.

    python -m benchmarks.startup [--presets tiny] [--rounds 2] [--save-figures PATH]

Three ways per preset, in turn each round: ``--runtime torch``; ONNX Runtime
with an empty export cache (the towers are exported on the way); and with the
cache that start filled. The server's CPU seconds by ready are printed beside
the wall time, which a busy machine stretches.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness import (
    Figure, ServerProcess, add_save_figures_argument, machine_line, mmserve_command, ruled, save_figures, utc_now,
)
from benchmarks.harness.server_process import READY_TIMEOUT_S

WAYS = ("torch", "ORT, cold export cache", "ORT, warm export cache")


def time_to_ready(preset: str, settings: dict[str, str]) -> tuple[float, float]:
    """Seconds from spawn to ready, and the CPU seconds the server's processes had spent by then."""
    started_s = time.monotonic()
    server = ServerProcess(mmserve_command(preset, settings))
    try:
        server.wait_ready(READY_TIMEOUT_S)
        return time.monotonic() - started_s, server.cpu_s()
    finally:
        server.stop()


def measure(preset: str, num_rounds: int, scratch: Path) -> dict[str, list[tuple[float, float]]]:
    """Each way's (wall s, CPU s) per round; a round's cold start gets an export cache of its own."""
    runs: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    for round_index in range(num_rounds):
        cache = scratch / f"{preset}-{round_index}"
        settings = {"torch": {"RUNTIME": "torch"},
                    "ORT, cold export cache": {"RUNTIME": "auto", "EXPORT_CACHE_DIR": str(cache)},
                    "ORT, warm export cache": {"RUNTIME": "auto", "EXPORT_CACHE_DIR": str(cache)}}
        for way in WAYS:
            runs[way].append(time_to_ready(preset, settings[way]))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["tiny"])
    parser.add_argument("--rounds", type=int, default=2)
    add_save_figures_argument(parser)
    args = parser.parse_args(argv)
    print(f"start-up to ready, {utc_now()}, {machine_line()}; {args.rounds} rounds, ways in turn", flush=True)
    rows = [("preset", "way", "median s to ready", "median CPU s", "runs s to ready")]
    figures = []
    with tempfile.TemporaryDirectory(prefix="mmserve-startup-") as scratch:
        for preset in args.presets:
            for way, runs in measure(preset, args.rounds, Path(scratch)).items():
                wall = statistics.median(wall_s for wall_s, _ in runs)
                cpu = statistics.median(cpu_s for _, cpu_s in runs)
                rows.append((preset, way, f"{wall:.1f}", f"{cpu:.1f}", " ".join(f"{w:.1f}" for w, _ in runs)))
                figures.append(Figure("startup_time", f"{preset}, {way}", round(wall, 1), "s"))
    print(ruled(rows))
    save_figures(args.save_figures, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
