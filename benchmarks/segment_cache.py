"""Segment cache benchmark: repeated images vs the same load uncached, and the cost on unique traffic.

One run, all on ``mmserve serve`` processes with the cache on and off (same
preset, seeds and batching), with the load generator of ``mmserve bench``:

1. the uncached saturation rate R: closed loop of fusion requests, cache off;
2. Zipf(s = 1.1) over 64 images with fresh texts: saturation throughput
   with the cache on vs off, and p99 at the open-loop rate R on vs off;
3. all-unique images (a pool larger than the run can exhaust): saturation
   throughput with the cache on vs off, the cost of hashing and bookkeeping.
   (The pool is generated up front, so it is sized to the run: check that
   the hit count printed for it is small.)

    python benchmarks/segment_cache.py --preset vit-b16
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import time

import torch

from benchmarks.loadgen.bench import run_bench
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.image_pool import ImageSize
from benchmarks.loadgen.workload import TextLengthRange, parse_mix
from benchmarks.serving_processes import mmserve_command, running

CACHE_OFF = {"CACHE_IMAGE_BYTES": "0", "CACHE_TEXT_BYTES": "0"}
CACHE_ON: dict[str, str] = {}
TEXT_CHARS = TextLengthRange(16, 48)


def _config(url: str, mode: RunMode, seconds: float, *, num_images: int, zipf: float | None,
            concurrency: int | None = None, rate: float | None = None, seed: int = 0) -> BenchConfig:
    return BenchConfig(url=url, mode=mode, duration_s=seconds, rate_rps=rate, concurrency=concurrency,
                       mix=parse_mix("fusion:1"), num_images=num_images, zipf_exponent=zipf,
                       image_size=ImageSize(320, 240), text_length=TEXT_CHARS, seed=seed, timeout_s=300.0,
                       show_progress=False)


def run(config: BenchConfig) -> dict:
    return asyncio.run(run_bench(config)).report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="vit-b16")
    parser.add_argument("--seconds", type=float, default=30.0, help="duration of each measurement")
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop clients at saturation")
    parser.add_argument("--unique-images", type=int, default=2048,
                        help="pool of the all-unique workload; keep it well above the requests a run sends")
    args = parser.parse_args()
    settings = {"MAX_BATCH_SIZE": "8"}
    zipf = {"num_images": 64, "zipf": 1.1}
    unique = {"num_images": args.unique_images, "zipf": None}  # uniform over a pool the run barely repeats
    rows: list[tuple[str, str, str, str]] = []

    def saturation(url: str, workload: dict, seed: int) -> float:
        return saturation_report(url, workload, seed)["throughput_rps"]

    def saturation_report(url: str, workload: dict, seed: int) -> dict:
        return run(_config(url, RunMode.CLOSED, args.seconds, concurrency=args.concurrency, seed=seed,
                           **workload))

    # Alternate off / on so drift in the machine's speed hits both sides alike.
    with running(mmserve_command(args.preset, {**settings, **CACHE_OFF})) as server:
        url = server.url
        rate = saturation(url, zipf, seed=1)
        zipf_off_rps = rate
        unique_off_rps = saturation(url, unique, seed=2)
        zipf_off_p99 = run(_config(url, RunMode.OPEN, args.seconds, rate=rate, seed=3, **zipf))["p99_ms"]
    with running(mmserve_command(args.preset, {**settings, **CACHE_ON})) as server:
        url = server.url
        zipf_on_rps = saturation(url, zipf, seed=1)
        unique_on = saturation_report(url, unique, seed=2)
        unique_on_rps = unique_on["throughput_rps"]
        unique_image_events = unique_on.get("server", {}).get("cache", {}).get("by_modality", {}).get("image", {})
    # A fresh process: the open loop starts from a cold cache.
    with running(mmserve_command(args.preset, {**settings, **CACHE_ON})) as server:
        url = server.url
        open_report = run(_config(url, RunMode.OPEN, args.seconds, rate=rate, seed=3, **zipf))
        zipf_on_p99 = open_report["p99_ms"]
        hit_ratio = open_report.get("server", {}).get("cache", {})

    print(f"segment cache benchmark, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, preset {args.preset}, "
          f"{platform.machine()} x{torch.get_num_threads()} torch threads, batch cap 8, fusion requests, "
          f"{args.seconds:.0f} s per measurement, closed loop of {args.concurrency} at saturation")
    rows.append(("Zipf(1.1) over 64 images, saturation req/s", f"{zipf_off_rps:.2f}", f"{zipf_on_rps:.2f}",
                 f"{zipf_on_rps / zipf_off_rps:.2f}x (target >= 1.8x)"))
    rows.append((f"Zipf(1.1) open loop at {rate:.2f} req/s, p99 ms", f"{zipf_off_p99:.0f}", f"{zipf_on_p99:.0f}",
                 f"{zipf_on_p99 / zipf_off_p99:.2f}x"))
    rows.append(("all-unique images, saturation req/s", f"{unique_off_rps:.2f}", f"{unique_on_rps:.2f}",
                 f"cost {100 * (1 - unique_on_rps / unique_off_rps):+.1f} % (target <= 3 %)"))
    print(f"{'workload':<48} {'cache off':>10} {'cache on':>10}  ratio")
    for name, off, on, ratio in rows:
        print(f"{name:<48} {off:>10} {on:>10}  {ratio}")
    print(f"image cache events in the all-unique run (cache on): {unique_image_events.get('events')}")
    print(f"cache events in the open-loop Zipf run (cache on): {hit_ratio}")


if __name__ == "__main__":
    main()
