"""One run of the load generator from a benchmark script, and the mixed workload soak and overload send.

``mixed_load_config``: square JPEGs and short texts in a mix, texts cut to
the model's limit (``truncate``) so that none is refused for its length.
"""

from __future__ import annotations

import asyncio
from typing import Any

from benchmarks.harness.sample_stats import ok_rate_rps
from benchmarks.loadgen.bench import run_bench
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.image_pool import ImageSize
from benchmarks.loadgen.runner import Sample
from benchmarks.loadgen.workload import TextLengthRange, parse_mix


def run_report(config: BenchConfig) -> dict[str, Any]:
    """The JSON report of one run (what ``mmserve bench`` prints)."""
    return asyncio.run(run_bench(config)).report


def run_samples(config: BenchConfig) -> list[Sample]:
    """Every request of one run, as the generator recorded it."""
    return list(asyncio.run(run_bench(config)).result.samples)


def mixed_load_config(url: str, *, mix: str, duration_s: float, rate_rps: float | None = None,
                      concurrency: int | None = None, seed: int = 0, num_images: int = 200, image_px: int = 256,
                      timeout_s: float = 30.0) -> BenchConfig:
    """Square JPEGs and short texts in ``mix``; open loop at ``rate_rps``, or closed loop at ``concurrency``."""
    return BenchConfig(url=url, mode=RunMode.OPEN if rate_rps is not None else RunMode.CLOSED,
                       duration_s=duration_s, rate_rps=rate_rps, concurrency=concurrency, mix=parse_mix(mix),
                       num_images=num_images, image_size=ImageSize(image_px, image_px),
                       text_length=TextLengthRange(8, 60), seed=seed, timeout_s=timeout_s, is_truncating=True,
                       show_progress=False)


def capacity_rps(url: str, *, mix: str, duration_s: float = 8.0, concurrency: int = 32,
                 image_px: int = 256) -> float:
    """Answers per second the server sustains with ``concurrency`` requests of ``mix`` always outstanding."""
    return ok_rate_rps(run_samples(mixed_load_config(url, mix=mix, duration_s=duration_s, concurrency=concurrency,
                                                     seed=1, image_px=image_px)))
