"""Soak: minutes of steady mixed load; does the server leak memory or file descriptors?

    python -m benchmarks.soak [--minutes 10] [--rate 0 (= half the measured capacity)] [--api-workers 1]

An open loop of text, image and fused requests (images repeat, so the
segment cache fills, evicts and is read) against ``mmserve serve``; every few
seconds each of its processes' RSS and open fds. Per process and resource:
first, last, min, max, and the slope per minute after the first minute (a
leak is a slope that does not vanish as the run gets longer). Linux only.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Sequence

from benchmarks.harness import (
    Figure, add_save_figures_argument, capacity_rps, latency_ms, mixed_load_config, mmserve_command, ruled, run_samples,
    running, save_figures,
)
from benchmarks.harness.process_resources import ProcessSeries, ProcessTreeSampler, slope_per_minute
from benchmarks.loadgen.runner import Sample

SAMPLE_INTERVAL_S = 5.0
WARM_UP_S = 60.0
MIX = "text:0.4,vision:0.3,fusion:0.3"


def resource_rows(series: ProcessSeries, warm_up_s: float) -> list[tuple[str, ...]]:
    """RSS and open-fd rows of one process: first, last, min, max and the slope after ``warm_up_s``."""
    steady = [i for i, t in enumerate(series.times_s) if t >= warm_up_s]
    times = [series.times_s[i] for i in steady]
    rows = []
    for name, values, scale, unit in (("rss", series.rss_bytes, 1024**2, "MiB"), ("open fds", series.num_fds, 1, "")):
        scaled = [value / scale for value in values]
        slope = slope_per_minute(times, [scaled[i] for i in steady])
        rows.append((f"{series.label} {series.pid} {name}", f"{scaled[0]:.1f}{unit}", f"{scaled[-1]:.1f}{unit}",
                     f"{min(scaled):.1f}{unit}", f"{max(scaled):.1f}{unit}", f"{slope:+.3f}{unit}"))
    return rows


def soak(preset: str, minutes: float, rate_rps: float, interval_s: float, is_cache_on: bool = True,
         num_api_workers: int = 1) -> tuple[str, list[Figure]]:
    """The printed report, and its headline figures: P99.99, p99, failed requests, the steepest RSS slope."""
    cache_bytes = (8 * 1024**2, 2 * 1024**2) if is_cache_on else (0, 0)
    settings = {"CACHE_IMAGE_BYTES": str(cache_bytes[0]), "CACHE_TEXT_BYTES": str(cache_bytes[1]),
                "API_WORKERS": str(num_api_workers)}
    with running(mmserve_command(preset, settings)) as server:
        rate = rate_rps if rate_rps > 0 else 0.5 * capacity_rps(server.url, mix=MIX)
        with ProcessTreeSampler(server.pid, interval_s) as sampler:
            samples = run_samples(mixed_load_config(server.url, mix=MIX, duration_s=minutes * 60, rate_rps=rate,
                                                    seed=2))
    warm_up_s = min(WARM_UP_S, minutes * 60 / 2)
    rows = [("process, resource", "first", "last", "min", "max", "slope/min (after warm-up)")]
    for series in sampler.series.values():
        rows.extend(resource_rows(series, warm_up_s))
    rss_slopes = {row[0]: float(row[-1].removesuffix("MiB")) for row in rows[1:] if row[0].endswith(" rss")}
    steepest = max(rss_slopes, key=rss_slopes.__getitem__)
    statuses = Counter(sample.outcome for sample in samples)
    summary = (f"soak: preset {preset}, --api-workers {num_api_workers}, {minutes:g} min, "
               f"cache {'8 + 2 MiB' if is_cache_on else 'off'}, open loop {rate:.1f} req/s ({MIX}); "
               f"{len(samples)} requests: {', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))}; "
               f"latency p50 {latency_ms(samples, 50):.1f} ms, p99 {latency_ms(samples, 99):.1f} ms, "
               f"p99.99 {latency_ms(samples, 99.99):.1f} ms; "
               f"{len(sampler.series)} processes read every {interval_s:g} s")
    failures = failures_report(samples)
    load = f"at {rate:.1f} req/s, {minutes:g} min"
    figures = [Figure("tail_under_load", f"P99.99 {load}", round(latency_ms(samples, 99.99), 1), "ms"),
               Figure("tail_under_load", f"p99 {load}", round(latency_ms(samples, 99), 1), "ms"),
               Figure("tail_under_load", f"failed requests of {len(samples)}", len(samples) - statuses["ok"], ""),
               Figure("tail_under_load", f"steepest RSS slope ({steepest.split()[0]})", rss_slopes[steepest],
                      "MiB/min")]
    return summary + "\n" + ruled(rows) + ("\n" + failures if failures else ""), figures


MAX_FAILURE_KINDS = 20
_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


def failures_report(samples: Sequence[Sample]) -> str:
    """Failed requests grouped by outcome and detail (its numbers aside), most first: how many, when, an example."""
    kinds: dict[tuple[str, str], list[Sample]] = {}
    for sample in samples:
        if not sample.is_ok:
            kinds.setdefault((sample.outcome, _NUMBERS.sub("N", sample.detail)), []).append(sample)
    if not kinds:
        return ""
    lines = ["failed requests (outcome: count, first and last at run seconds; the first one's detail):"]
    ordered = sorted(kinds.values(), key=lambda kind: -len(kind))
    for kind in ordered[:MAX_FAILURE_KINDS]:
        times = [sample.done_s for sample in kind]
        lines.append(f"  {kind[0].outcome}: {len(kind)}, at {min(times):.1f} .. {max(times):.1f} s; "
                     f"{kind[0].detail or '-'}")
    if len(ordered) > MAX_FAILURE_KINDS:
        lines.append(f"  ... {len(ordered) - MAX_FAILURE_KINDS} more kinds")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=0.0, help="requests/s; 0: half of the measured capacity")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--interval-s", type=float, default=SAMPLE_INTERVAL_S)
    parser.add_argument("--cache-off", action="store_true",
                        help="turn the segment cache off, to tell a leak from caches filling")
    parser.add_argument("--api-workers", type=int, default=1, help="mmserve serve --api-workers N (default 1)")
    add_save_figures_argument(parser)
    args = parser.parse_args(argv)
    report, figures = soak(args.preset, args.minutes, args.rate, args.interval_s, is_cache_on=not args.cache_off,
                           num_api_workers=args.api_workers)
    print(report)
    save_figures(args.save_figures, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
