"""Segment cache benchmark: repeated images vs the same load uncached, and the cost on unique traffic.

On ``mmserve serve`` with the cache on and off: Zipf(1.1) over 64 images with
fresh texts (saturation on vs off, and p99 at the uncached saturation rate),
then all-unique images (saturation on vs off, A-B-B-A: the cost of hashing
and bookkeeping; the pool is sized to the run, so its hit count should be small).

    python -m benchmarks.segment_cache --preset vit-b16
"""

from __future__ import annotations

import argparse
import platform
import statistics

import torch

from benchmarks.harness import (
    Figure, abba_sequence, add_save_figures_argument, mmserve_command, paused_servers, resumed, run_report, running,
    save_figures, utc_now,
)
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.image_pool import ImageSize
from benchmarks.loadgen.workload import TextLengthRange, parse_mix

CACHE_OFF = {"CACHE_IMAGE_BYTES": "0", "CACHE_TEXT_BYTES": "0"}
CACHE_ON: dict[str, str] = {}
TEXT_CHARS = TextLengthRange(16, 48)


def _config(url: str, mode: RunMode, seconds: float, *, num_images: int, zipf: float | None,
            concurrency: int | None = None, rate: float | None = None, seed: int = 0) -> BenchConfig:
    return BenchConfig(url=url, mode=mode, duration_s=seconds, rate_rps=rate, concurrency=concurrency,
                       mix=parse_mix("fusion:1"), num_images=num_images, zipf_exponent=zipf,
                       image_size=ImageSize(320, 240), text_length=TEXT_CHARS, seed=seed, timeout_s=300.0,
                       show_progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="vit-b16")
    parser.add_argument("--seconds", type=float, default=30.0, help="duration of each measurement")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop clients at saturation")
    parser.add_argument("--unique-images", type=int, default=2048,
                        help="pool of the all-unique workload; keep it well above the requests a run sends")
    parser.add_argument("--workloads", nargs="+", choices=("zipf", "unique"), default=["zipf", "unique"])
    add_save_figures_argument(parser)
    args = parser.parse_args()
    print(f"segment cache benchmark, {utc_now()}, preset {args.preset}, "
          f"{platform.machine()} x{torch.get_num_threads()} torch threads, batch cap 8, fusion requests, "
          f"{args.seconds:.0f} s per measurement, closed loop of {args.concurrency} at saturation")
    print(f"{'workload':<48} {'cache off':>10} {'cache on':>10}  ratio")
    figures: list[Figure] = []
    if "zipf" in args.workloads:
        figures.append(measure_zipf(args))
    if "unique" in args.workloads:
        figures.append(measure_unique(args))
    save_figures(args.save_figures, figures)


SETTINGS = {"MAX_BATCH_SIZE": "8"}


def _saturation(url: str, args: argparse.Namespace, workload: dict, seed: int) -> dict:
    return run_report(_config(url, RunMode.CLOSED, args.seconds, concurrency=args.concurrency, seed=seed, **workload))


def _row(name: str, off: str, on: str, ratio: str) -> None:
    print(f"{name:<48} {off:>10} {on:>10}  {ratio}", flush=True)


def measure_zipf(args: argparse.Namespace) -> Figure:
    """Zipf over 64 images: saturation with the cache off then on, then p99 at the uncached rate."""
    zipf = {"num_images": 64, "zipf": 1.1}
    with running(mmserve_command(args.preset, {**SETTINGS, **CACHE_OFF})) as server:
        rate = off_rps = _saturation(server.url, args, zipf, seed=1)["throughput_rps"]
        off_p99 = run_report(_config(server.url, RunMode.OPEN, args.seconds, rate=rate, seed=3, **zipf))["p99_ms"]
    with running(mmserve_command(args.preset, {**SETTINGS, **CACHE_ON})) as server:
        on_rps = _saturation(server.url, args, zipf, seed=1)["throughput_rps"]
    # A fresh process: the open loop starts from a cold cache.
    with running(mmserve_command(args.preset, {**SETTINGS, **CACHE_ON})) as server:
        open_report = run_report(_config(server.url, RunMode.OPEN, args.seconds, rate=rate, seed=3, **zipf))
    _row("Zipf(1.1) over 64 images, saturation req/s", f"{off_rps:.2f}", f"{on_rps:.2f}",
         f"{on_rps / off_rps:.2f}x (target >= 1.8x)")
    _row(f"Zipf(1.1) open loop at {rate:.2f} req/s, p99 ms", f"{off_p99:.0f}", f"{open_report['p99_ms']:.0f}",
         f"{open_report['p99_ms'] / off_p99:.2f}x")
    print(f"  cache events in the open-loop run (cache on): {open_report.get('server', {}).get('cache')}")
    return Figure("cache_gain", "Zipf(1.1) saturation, cache on over off", round(on_rps / off_rps, 2), "x")


def measure_unique(args: argparse.Namespace) -> Figure:
    """Every image new: what hashing, lookups, copies and inserts cost when nothing is reused.

    Both servers stay up and take turns (off, on, on, off; the idle one is
    paused), so the machine's drift hits both alike; each side's runs are pooled.
    """
    unique = {"num_images": args.unique_images, "zipf": None}
    commands = {"off": mmserve_command(args.preset, {**SETTINGS, **CACHE_OFF}),
                "on": mmserve_command(args.preset, {**SETTINGS, **CACHE_ON})}
    rates: dict[str, list[float]] = {"off": [], "on": []}
    events = None
    with paused_servers(commands) as servers:
        for round_index, side in enumerate(abba_sequence("off", "on", 2)):
            with resumed(servers[side]) as active:
                report = _saturation(active.url, args, unique, seed=2 + round_index)
            rates[side].append(report["throughput_rps"])
            if side == "on":
                events = report.get("server", {}).get("cache", {}).get("by_modality", {}).get("image", {})
    off_rps, on_rps = (statistics.fmean(rates[side]) for side in ("off", "on"))
    _row(f"all-unique images ({args.unique_images} pool), saturation req/s", f"{off_rps:.2f}", f"{on_rps:.2f}",
         f"cost {100 * (1 - on_rps / off_rps):+.1f} % (target <= 3 %)")
    print(f"  runs off {[round(r, 2) for r in rates['off']]}, on {[round(r, 2) for r in rates['on']]}; "
          f"image cache events of the last run (cache on): {(events or {}).get('events')}; "
          "a hit means the pool repeated")
    return Figure("cache_gain", "all-unique images, cost of the cache", round(100 * (1 - on_rps / off_rps), 1), "%")


if __name__ == "__main__":
    main()
