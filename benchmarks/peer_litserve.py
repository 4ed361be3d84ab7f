"""mmserve against LitServe: same model, same inputs, same generator, one run (BENCHMARKS.md, "mmserve vs LitServe").

LitServe serves the same seeded preset with the same preprocessing, batch cap
and delay (``benchmarks.peer_litserve_app``, one worker, ``fast_queue``), both
servers on TorchScript encoders; mmserve's segment cache is off, so both
compute every request. Per preset, A-B-B-A (``benchmarks.harness``):
saturation, then p50/p99 at 70 % of LitServe's saturation. Then one batch with
a bad item: 8 concurrent fusion requests in one batch, one a truncated JPEG;
every status is printed. Texts are 16-60 characters, which every preset takes whole.

    python -m benchmarks.peer_litserve --presets tiny vit-b16
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from benchmarks.harness import (
    AlternationPlan, Figure, RunSpec, ServerCommand, ServerRuns, Targets, add_save_figures_argument, compare,
    comparison_figures, format_comparison, litserve_command, machine_line, mmserve_command, num_usable_cpus, running,
    save_figures, utc_now,
)
from benchmarks.loadgen.config import BenchConfig
from benchmarks.loadgen.image_pool import ImageFormat, ImagePool, ImageSize
from benchmarks.loadgen.runner import INFER_PATH
from benchmarks.loadgen.server_metrics import batch_size_view, scrape
from benchmarks.loadgen.workload import TextLengthRange

BATCH_CAP = 8
QUEUE_DELAY_MS = 5.0
PROBE_QUEUE_DELAY_MS = 250.0
PROBE_SIZE = 8
PROBE_BAD_INDEX = 3
CACHE_OFF = {"CACHE_IMAGE_BYTES": "0", "CACHE_TEXT_BYTES": "0"}
LITSERVE = "litserve"
MMSERVE = "mmserve"


# Texts fit every preset's token limit (the tiny preset takes 64 tokens), so no request needs truncating.
TEXT_CHARS = TextLengthRange(16, 60)
PLANS = {  # each round runs both servers once; an even number mirrors the order (A-B-B-A)
    "tiny": AlternationPlan(seconds=10.0, num_rounds=4, warmup_s=3.0, concurrency=32),
    "vit-b16": AlternationPlan(seconds=25.0, num_rounds=2, warmup_s=6.0, concurrency=16),
}
TARGETS = {"tiny": Targets(1.15, 0.5), "vit-b16": Targets(1.0, 0.7)}


def _config(run: RunSpec) -> BenchConfig:
    """The generator's defaults (mix, 100 JPEGs 224x224) with texts every preset takes whole."""
    return run.config(text_length=TEXT_CHARS, timeout_s=60.0)


def measure_preset(preset: str, plan: AlternationPlan, device: str) -> dict[str, ServerRuns]:
    """Saturation, then the fixed open-loop rate, alternating the two servers A-B-B-A."""
    settings = {**CACHE_OFF, "MAX_BATCH_SIZE": str(BATCH_CAP), "MAX_QUEUE_DELAY_MS": str(QUEUE_DELAY_MS)}
    commands = {
        MMSERVE: mmserve_command(preset, settings, device=device),
        LITSERVE: litserve_command(preset, max_batch_size=BATCH_CAP, max_queue_delay_ms=QUEUE_DELAY_MS,
                                   device=device, is_fast_queue=True, is_traced=True),
    }
    return compare(commands, LITSERVE, MMSERVE, plan, _config, preset)


# -- one batch with a bad item ---------------------------------------------------------


@dataclass(frozen=True)
class ProbeResult:
    statuses: tuple[int, ...]
    batch_sizes: str


def probe_bodies(num_items: int, bad_index: int) -> list[bytes]:
    """Fusion requests over distinct images; item ``bad_index`` carries the first half of its JPEG."""
    pool = ImagePool(7, ImageSize(224, 224), ImageFormat.JPEG)
    pool.prepare(range(num_items))
    bodies = []
    for index in range(num_items):
        b64 = pool.b64(index)
        if index == bad_index:
            data = base64.b64decode(b64)
            b64 = base64.b64encode(data[: len(data) // 2])
        bodies.append(b'{"image":{"b64":"' + b64 + b'"},"text":"probe item ' + str(index).encode() + b'"}')
    return bodies


async def _send_together(url: str, ready_path: str, bodies: Sequence[bytes]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0, trust_env=False) as client:
        # Open every connection first, so the requests leave together rather than one handshake apart.
        await asyncio.gather(*(client.get(ready_path) for _ in bodies))
        headers = {"content-type": "application/json"}
        return list(await asyncio.gather(*(client.post(INFER_PATH, content=body, headers=headers)
                                           for body in bodies)))


async def _mmserve_batches(url: str, bodies: Sequence[bytes]) -> ProbeResult:
    async with httpx.AsyncClient(base_url=url, timeout=10.0, trust_env=False) as client:
        before = await scrape(client, 10.0)
        responses = await _send_together(url, "/health/live", bodies)
        after = await scrape(client, 10.0)
    view = None
    if before.snapshot is not None and after.snapshot is not None:
        view = batch_size_view(before.snapshot, after.snapshot)
    parts = []
    for lane, entry in sorted((view or {}).items()):
        if entry["num_batches"]:
            parts.append(f"{lane} lane ran {int(entry['num_batches'])} batch(es) holding "
                         f"{int(entry['num_requests'])} request(s)")
    return ProbeResult(tuple(r.status_code for r in responses), "; ".join(parts) or "no batch recorded")


async def _litserve_batches(url: str, bodies: Sequence[bytes]) -> ProbeResult:
    responses = await _send_together(url, "/health", bodies)
    sizes = sorted({r.json()["batch_size"] for r in responses if r.status_code == 200})
    failed = [i for i, r in enumerate(responses) if r.status_code != 200]
    text = f"answered items report batch sizes {sizes}" if sizes else "no item was answered"
    if failed:
        text += f"; items {failed} failed"
    return ProbeResult(tuple(r.status_code for r in responses), text)


def run_bad_item_probe(device: str) -> str:
    bodies = probe_bodies(PROBE_SIZE, PROBE_BAD_INDEX)
    settings = {**CACHE_OFF, "MAX_BATCH_SIZE": str(PROBE_SIZE), "MAX_QUEUE_DELAY_MS": str(PROBE_QUEUE_DELAY_MS)}
    results: dict[str, ProbeResult] = {}
    commands: dict[str, ServerCommand] = {
        MMSERVE: mmserve_command("tiny", settings, device=device),
        LITSERVE: litserve_command("tiny", max_batch_size=PROBE_SIZE, max_queue_delay_ms=PROBE_QUEUE_DELAY_MS,
                                   device=device, is_fast_queue=True, is_traced=True),
    }
    with running(commands[MMSERVE]) as server:
        results[MMSERVE] = asyncio.run(_mmserve_batches(server.url, bodies))
    with running(commands[LITSERVE]) as server:
        results[LITSERVE] = asyncio.run(_litserve_batches(server.url, bodies))
    lines = [f"one batch with a bad item: {PROBE_SIZE} concurrent fusion requests (tiny preset), item "
             f"{PROBE_BAD_INDEX} a JPEG cut in half; batch cap {PROBE_SIZE}, batch delay {PROBE_QUEUE_DELAY_MS:g} ms"]
    for name in (LITSERVE, MMSERVE):
        result = results[name]
        others = [status for i, status in enumerate(result.statuses) if i != PROBE_BAD_INDEX]
        lines.append(f"  {name:8s} statuses {list(result.statuses)}  bad item {result.statuses[PROBE_BAD_INDEX]}, "
                     f"other {len(others)}: {sum(s == 200 for s in others)} x 200  ({result.batch_sizes})")
    return "\n".join(lines)


# -- the run -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny", "vit-b16"], choices=sorted(PLANS))
    parser.add_argument("--rounds", type=int, help="rounds per measurement (one run per server each), "
                        "overriding each preset's plan")
    parser.add_argument("--seconds", type=float, help="seconds per run, overriding each preset's plan")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--no-probe", action="store_true", help="skip the bad-item batch")
    add_save_figures_argument(parser)
    args = parser.parse_args(argv)

    print(f"mmserve vs LitServe, {utc_now()}, {machine_line()}")
    print(f"device {args.device}, float32, batch cap {BATCH_CAP}, batch delay {QUEUE_DELAY_MS:g} ms on both; "
          "mmserve segment cache off; LitServe 1 worker with fast_queue; encoders "
          "as TorchScript graphs on both; "
          "the idle server is paused during the "
          "other's runs; workload: generator defaults (mix text:0.2,vision:0.3,fusion:0.5, 100 JPEGs 224x224) "
          "with texts of 16-60 chars", flush=True)
    tables = []
    figures: list[Figure] = []
    for name in args.presets:
        plan = PLANS[name]
        if args.seconds is not None:
            plan = dataclasses.replace(plan, seconds=args.seconds)
        if args.rounds is not None:
            plan = dataclasses.replace(plan, num_rounds=args.rounds)
        runs = measure_preset(name, plan, args.device)
        tables.append(format_comparison(f"preset {name}", runs, LITSERVE, MMSERVE, plan, TARGETS[name],
                                        num_usable_cpus(), "mm/lit"))
        figures += comparison_figures(f"litserve_{name.replace('-', '_')}", runs, LITSERVE, MMSERVE)
        print(tables[-1], flush=True)
    if not args.no_probe:
        tables.append(run_bad_item_probe(args.device))
        print(tables[-1], flush=True)
    save_figures(args.save_figures, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
