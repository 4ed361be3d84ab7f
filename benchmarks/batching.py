"""Batching benchmark: served vs raw throughput, batching gain, and text isolation, side by side in one run.

1. served / raw: saturation of ``mmserve serve`` (closed loop of fusion
   requests, cache off) over a direct batched forward of the same model in
   this process (TorchScript encoders, before and after; the mean), and the
   same for LitServe on the same model (``benchmarks.peer_litserve_app``).
2. batching gain: served saturation with ``max_batch_size`` 8 over 1.
3. isolation: text p99 (open loop) beside a closed loop saturating the
   vision lane from another process, over the text p99 alone.

    python -m benchmarks.batching --presets tiny vit-b16
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import platform
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from benchmarks.encoder_tracing import trace_all_encoders
from benchmarks.harness import (
    Figure, add_save_figures_argument, fixed_width, litserve_command, mmserve_command, run_report, running, save_figures,
    utc_now,
)
from benchmarks.loadgen.bench import run_bench
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.image_pool import ImageSize
from benchmarks.loadgen.workload import TextLengthRange, parse_mix
from models.loading.repository import build_preset

BATCH_CAP = 8
BATCH_DELAY_MS = 5.0  # mmserve's default max_queue_delay_ms, given to LitServe too
NO_CACHE = {"CACHE_IMAGE_BYTES": "0", "CACHE_TEXT_BYTES": "0"}
TEXT_CHARS = TextLengthRange(16, 48)  # fits every preset's token limit


@dataclass(frozen=True)
class PresetPlan:
    preset: str
    seconds: float
    concurrency: int
    text_rate_rps: float


def raw_throughput(preset: str, seconds: float) -> float:
    """Fusion items per second of a direct batched loop (vision + text + fusion), batch = cap, TorchScript
    encoders as ``mmserve serve`` runs them by default (the same compute path)."""
    bundle = build_preset(preset, seed=0)
    trace_all_encoders(bundle.model)
    size = bundle.config.preprocess.input_size
    images = torch.randint(0, 256, (BATCH_CAP, size, size, 3), dtype=torch.uint8)
    token_ids = [bundle.tokenizer.encode("a photo of a small red boat " + str(i), truncate=True).token_ids
                 for i in range(BATCH_CAP)]
    model = bundle.model
    model.fuse(model.encode_images(images), model.encode_texts(token_ids, pad_to=32))  # warm
    num_items, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        model.fuse(model.encode_images(images), model.encode_texts(token_ids, pad_to=32))
        num_items += BATCH_CAP
    return num_items / (time.perf_counter() - started)


def _config(url: str, mode: RunMode, seconds: float, mix: str, image_px: int, *,
            concurrency: int | None = None, rate: float | None = None, seed: int = 0) -> BenchConfig:
    return BenchConfig(url=url, mode=mode, duration_s=seconds, rate_rps=rate, concurrency=concurrency,
                       mix=parse_mix(mix), num_images=64, image_size=ImageSize(image_px, image_px),
                       text_length=TEXT_CHARS, seed=seed, timeout_s=120.0, show_progress=False)


def served_throughput(url: str, plan: PresetPlan, image_px: int) -> float:
    """Saturation ok/s of fusion requests: a closed loop of ``plan.concurrency`` clients."""
    return run_report(_config(url, RunMode.CLOSED, plan.seconds, "fusion:1", image_px,
                              concurrency=plan.concurrency))["throughput_rps"]


def vision_load_command(url: str, plan: PresetPlan, image_px: int) -> list[str]:
    """``mmserve bench`` saturating the vision lane: a closed loop of image-only requests."""
    return [sys.executable, "-m", "server.cli", "bench", url, "--concurrency", str(plan.concurrency),
            "--duration", str(plan.seconds), "--mix", "vision:1", "--images", "64",
            "--image-size", f"{image_px}x{image_px}", "--seed", "2", "--timeout-s", "120", "--no-progress"]


async def text_p99(url: str, plan: PresetPlan, image_px: int, with_vision_load: bool) -> float:
    """Text p99 under an open loop; with ``with_vision_load``, beside a vision load from a process of its own
    (in this one, its answers would compete with the text answers for the generator's event loop)."""
    text_run = run_bench(_config(url, RunMode.OPEN, plan.seconds, "text:1", image_px,
                                 rate=plan.text_rate_rps, seed=1))
    if not with_vision_load:
        return (await text_run).report["p99_ms"]
    vision_load = subprocess.Popen(vision_load_command(url, plan, image_px),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await asyncio.sleep(1.0)  # the vision lane is saturated before the text clock starts
        return (await text_run).report["p99_ms"]
    finally:
        vision_load.wait(timeout=plan.seconds + 120)


def measure(plan: PresetPlan) -> dict[str, float]:
    image_px = build_preset(plan.preset).config.preprocess.input_size
    row: dict[str, float] = {}
    raw_before = raw_throughput(plan.preset, plan.seconds)
    with running(mmserve_command(plan.preset, {**NO_CACHE, "MAX_BATCH_SIZE": str(BATCH_CAP)})) as server:
        row["served_rps"] = served_throughput(server.url, plan, image_px)
        row["text_p99_alone_ms"] = asyncio.run(text_p99(server.url, plan, image_px, with_vision_load=False))
        row["text_p99_loaded_ms"] = asyncio.run(text_p99(server.url, plan, image_px, with_vision_load=True))
    row["raw_rps"] = (raw_before + raw_throughput(plan.preset, plan.seconds)) / 2
    with running(mmserve_command(plan.preset, {**NO_CACHE, "MAX_BATCH_SIZE": "1"})) as server:
        row["served_batch1_rps"] = served_throughput(server.url, plan, image_px)
    peer = litserve_command(plan.preset, max_batch_size=BATCH_CAP, max_queue_delay_ms=BATCH_DELAY_MS,
                            is_fast_queue=True, is_traced=True)
    with running(peer) as server:
        row["litserve_rps"] = served_throughput(server.url, plan, image_px)
    return row


HEADLINE_PRESET = "vit-b16"  # the headline's served-vs-raw row: the preset whose compute dominates
PLANS = {
    "tiny": PresetPlan("tiny", seconds=15.0, concurrency=32, text_rate_rps=20.0),
    "vit-b16": PresetPlan("vit-b16", seconds=30.0, concurrency=16, text_rate_rps=2.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny", "vit-b16"], choices=sorted(PLANS))
    parser.add_argument("--seconds", type=float, help="override each measurement's duration")
    add_save_figures_argument(parser)
    args = parser.parse_args()
    print(f"batching benchmark, {utc_now()}, "
          f"{platform.machine()} x{torch.get_num_threads()} torch threads, torch {torch.__version__}, float32, "
          f"batch cap {BATCH_CAP}, cache off")
    header = ("preset", "raw_rps", "served_rps", "served/raw", "litserve_rps", "litserve/raw", "batch1_rps",
              "gain 8/1", "text_p99_alone", "text_p99_loaded", "isolation")
    print(fixed_width(header, 15))
    figures: list[Figure] = []
    for name in args.presets:
        plan = PLANS[name] if args.seconds is None else dataclasses.replace(PLANS[name], seconds=args.seconds)
        row = measure(plan)
        values = (name, f"{row['raw_rps']:.1f}", f"{row['served_rps']:.1f}",
                  f"{row['served_rps'] / row['raw_rps']:.3f}", f"{row['litserve_rps']:.1f}",
                  f"{row['litserve_rps'] / row['raw_rps']:.3f}", f"{row['served_batch1_rps']:.1f}",
                  f"{row['served_rps'] / row['served_batch1_rps']:.2f}", f"{row['text_p99_alone_ms']:.1f} ms",
                  f"{row['text_p99_loaded_ms']:.1f} ms", f"{row['text_p99_loaded_ms'] / row['text_p99_alone_ms']:.2f}")
        print(fixed_width(values, 15), flush=True)
        if name == HEADLINE_PRESET:
            figures += [Figure("served_vs_raw", "served/raw", float(values[3]), ""),
                        Figure("served_vs_raw", "LitServe/raw", float(values[5]), ""),
                        Figure("served_vs_raw", "batching gain 8/1", float(values[7]), "x"),
                        Figure("served_vs_raw", "text p99 loaded/alone", float(values[10]), "x")]
    save_figures(args.save_figures, figures)


if __name__ == "__main__":
    main()
