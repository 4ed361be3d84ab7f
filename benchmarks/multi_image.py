"""Several images per request against the same images sent one per request, on one mmserve server.

A client that needs K images fused with a text has two ways: one request
carrying the K images, or (what a single-image API forces) K requests. The
first must not cost more image work: the vision batcher counts images, not
requests, so K images from one request fill a batch as K single-image
requests do. Measured per preset, with every image new (``use_cache``
false) so every image is encoded:

1. saturation: C clients back to back; images answered per second, for
   K-image requests and for K single-image requests sent together (their
   text the same), in A-B-B-A rounds so the machine's drift falls on both;
2. fixed rate: Poisson arrivals of K-image "needs" at 50 % of the singles'
   saturation; the latency of a need is that of its one K-image request, or
   of the slowest of its K single requests, from its intended send time
   (open loop: a slow server cannot hide its queue);
3. cache gain: requests of one catalogue image shared by all plus one new
   image, with the cache on against off: images/s and images encoded.

Target: K-image requests within 5 % of K single-image requests in images/s.

    python -m benchmarks.multi_image --presets tiny vit-b16
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import numpy as np
from PIL import Image

from benchmarks.harness import (
    ServerProcess, abba_sequence, machine_line, mmserve_command, percentile_ms, running, utc_now,
)
from benchmarks.loadgen.workload import poisson_offsets_s

IMAGE_SIZE_PX = 224
FIXED_RATE_SHARE = 0.5  # of the singles' saturation: the generator shares the two cores, so 0.7 left it behind
TARGET_RATIO = 0.95
TEXT = "what do these pictures have in common?"


@dataclass(frozen=True)
class Plan:
    seconds: float
    num_rounds: int
    concurrency: int


class ImageSource:
    """Distinct JPEGs, base64, made once: every request gets images the server has not seen."""

    def __init__(self, count: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self._images = [self._jpeg(rng) for _ in range(count)]
        self._next = 0

    @staticmethod
    def _jpeg(rng: np.random.Generator) -> str:
        pixels = rng.integers(0, 256, (IMAGE_SIZE_PX, IMAGE_SIZE_PX, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        return base64.b64encode(buffer.getvalue()).decode()

    def take(self, count: int) -> list[dict]:
        taken = []
        for _ in range(count):
            taken.append({"b64": self._images[self._next % len(self._images)]})
            self._next += 1
        return taken


def _bodies(mode: str, num_images: int, source: ImageSource, catalogue: dict | None) -> list[dict]:
    """The requests of one need: ``multi`` one K-image request, ``single`` K one-image requests,
    ``cached``/``uncached`` the catalogue image plus one new image."""
    if mode == "multi":
        return [{"text": TEXT, "images": source.take(num_images), "use_cache": False}]
    if mode == "single":
        return [{"text": TEXT, "images": [image], "use_cache": False} for image in source.take(num_images)]
    return [{"text": TEXT, "images": [catalogue, *source.take(1)], "use_cache": mode == "cached"}]


async def _post(client: httpx.AsyncClient, body: dict) -> int:
    """The answer's status, or 0 when the connection failed."""
    try:
        return (await client.post("/v1/infer", json=body)).status_code
    except httpx.HTTPError:
        return 0


async def _need(client: httpx.AsyncClient, bodies: Sequence[dict]) -> tuple[int, int]:
    """Send one need's requests at once; (images answered, failed requests)."""
    statuses = await asyncio.gather(*(_post(client, body) for body in bodies))
    failures = sum(status != 200 for status in statuses)
    return sum(len(body["images"]) for body, status in zip(bodies, statuses) if status == 200), failures


async def _saturate(url: str, mode: str, num_images: int, plan: Plan, source: ImageSource,
                    catalogue: dict | None) -> tuple[float, int]:
    """Images answered per second with ``plan.concurrency`` clients back to back; and failures."""
    deadline_s = time.perf_counter() + plan.seconds
    totals = [0, 0]

    async def worker(client: httpx.AsyncClient) -> None:
        while time.perf_counter() < deadline_s:
            images, failures = await _need(client, _bodies(mode, num_images, source, catalogue))
            totals[0] += images
            totals[1] += failures

    started_s = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=256)) as client:
        await asyncio.gather(*(worker(client) for _ in range(plan.concurrency)))
    return totals[0] / (time.perf_counter() - started_s), totals[1]


async def _open_loop(url: str, mode: str, num_images: int, rate_needs: float, seconds: float, seed: int,
                     source: ImageSource) -> tuple[list[float], int]:
    """Each need's latency (s) from its intended send time, Poisson arrivals at ``rate_needs`` needs/s;
    and the number of failed needs (not in the latencies)."""
    latencies_s: list[float] = []
    num_failed = 0
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=128)) as client:
        started_s = time.perf_counter()

        async def one(intended_s: float, bodies: list[dict]) -> None:
            nonlocal num_failed
            await asyncio.sleep(max(0.0, intended_s - time.perf_counter()))
            _, failures = await _need(client, bodies)
            if failures:
                num_failed += 1
            else:
                latencies_s.append(time.perf_counter() - intended_s)

        tasks = [asyncio.ensure_future(one(started_s + offset, _bodies(mode, num_images, source, None)))
                 for offset in poisson_offsets_s(rate_needs, seconds, seed)]
        await asyncio.gather(*tasks)
    return latencies_s, num_failed


def _compare(server: ServerProcess, num_images: int, plan: Plan, source: ImageSource) -> dict[str, float]:
    rates: dict[str, list[float]] = {"multi": [], "single": []}
    failures = 0
    asyncio.run(_saturate(server.url, "single", num_images, Plan(2.0, 1, plan.concurrency), source, None))  # warm
    for mode in abba_sequence("multi", "single", plan.num_rounds):
        rate, failed = asyncio.run(_saturate(server.url, mode, num_images, plan, source, None))
        rates[mode].append(rate)
        failures += failed
    rate_needs = FIXED_RATE_SHARE * statistics.fmean(rates["single"]) / num_images
    latencies_s: dict[str, list[float]] = {"multi": [], "single": []}
    for index, mode in enumerate(abba_sequence("single", "multi", plan.num_rounds)):
        measured, failed = asyncio.run(_open_loop(server.url, mode, num_images, rate_needs, plan.seconds,
                                                  seed=index // 2, source=source))
        latencies_s[mode] += measured
        failures += failed
    return {
        "multi_images_per_s": statistics.fmean(rates["multi"]), "single_images_per_s": statistics.fmean(rates["single"]),
        "multi_p99_ms": percentile_ms(latencies_s["multi"], 99),
        "single_p99_ms": percentile_ms(latencies_s["single"], 99),
        "rate_needs_per_s": rate_needs, "failures": failures,
    }


def _cache_gain(server: ServerProcess, plan: Plan, source: ImageSource) -> dict[str, float]:
    catalogue = source.take(1)[0]
    rates: dict[str, list[float]] = {"cached": [], "uncached": []}
    for mode in abba_sequence("cached", "uncached", plan.num_rounds):
        rates[mode].append(asyncio.run(_saturate(server.url, mode, 2, plan, source, catalogue))[0])
    return {mode: statistics.fmean(values) for mode, values in rates.items()}


def run_preset(preset: str, plan: Plan, image_counts: Sequence[int]) -> None:
    settings = {"MAX_BATCH_SIZE": "8", "MAX_QUEUE_DELAY_MS": "5", "MAX_QUEUE_SIZE": "4096",
                "MAX_IMAGES_PER_REQUEST": str(max(image_counts)), "MAX_DECODE_QUEUE": "8192"}
    source = ImageSource(2048, seed=hash(preset) & 0xFFFF)
    with running(mmserve_command(preset, settings)) as server:
        server.resume()
        print(f"\n{preset}: {plan.concurrency} clients, {plan.seconds:.0f} s runs, {plan.num_rounds} rounds "
              "alternated (A-B-B-A); every image new (use_cache false)")
        print("| images per need | K-image requests, images/s | K single requests, images/s | ratio "
              f"(target >= {TARGET_RATIO}) | fixed rate, needs/s | p99 K-image, ms | p99 K singles, ms | failures |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for num_images in image_counts:
            result = _compare(server, num_images, plan, source)
            ratio = result["multi_images_per_s"] / result["single_images_per_s"]
            print(f"| {num_images} | {result['multi_images_per_s']:.1f} | {result['single_images_per_s']:.1f} | "
                  f"{ratio:.3f} {'met' if ratio >= TARGET_RATIO else 'NOT met'} | {result['rate_needs_per_s']:.1f} | "
                  f"{result['multi_p99_ms']:.0f} | {result['single_p99_ms']:.0f} | {result['failures']:.0f} |",
                  flush=True)
        gain = _cache_gain(server, plan, source)
        print(f"\n{preset} cache gain: requests of one shared catalogue image + one new image, images/s: "
              f"cache on {gain['cached']:.1f}, off {gain['uncached']:.1f}, "
              f"ratio {gain['cached'] / gain['uncached']:.2f} (the shared image is encoded once with the cache on)")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "vit-b16"])
    parser.add_argument("--images", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=12)
    args = parser.parse_args(argv)
    print(f"machine: {machine_line()}")
    print(f"date: {utc_now()}")
    for preset in args.presets:
        run_preset(preset, Plan(args.seconds, args.rounds, args.concurrency), args.images)


if __name__ == "__main__":
    main()
