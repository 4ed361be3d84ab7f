"""Several GPUs behind one server: one engine per device against one engine, served images/s on the same box.

``benchmarks/gpu/run.sh``, step 4. Only where more than one GPU is visible
(otherwise it says so and exits 0: nothing measured, nothing faked). A random
SigLIP at google/siglip-large-patch16-256's shape, bf16 with CUDA graphs,
segment cache off, served by one engine (``--device cuda``), two
(``--devices cuda:0,cuda:1``) and N (``--engines auto``, when N > 2), each at
saturation through wrk (``benchmarks.gpu.served``, 64 requests in flight per
engine): images/s and the ratio to one engine (ideal: the engine count);
checks: every engine computed batches, no non-2xx, no cold compile after ready.

Exit status: 0 passed (or skipped), 1 a check failed, 2 no CUDA.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.gpu.report import EXIT_NO_CUDA, Deadline, Report, Row, cuda_missing
from benchmarks.gpu.served import (
    find_wrk, kserve_uint8_body, metric_sum, run_wrk, scrape, served_arguments, start_server,
)

_BATCH_COUNT = re.compile(r'^mmserve_batch_size_count\{([^}]*)\}\s+(\S+)$', re.MULTILINE)
_ENGINE_LABEL = re.compile(r'engine="([^"]*)"')


@dataclass(frozen=True)
class EngineRun:
    """One served configuration: its row label, its flags beside ``--device cuda``, and the engines it should run."""

    label: str
    extra_args: tuple[str, ...]
    num_engines: int


def engine_runs(num_gpus: int) -> list[EngineRun]:
    """One engine, two listed devices, and (on a box with more than two GPUs) one engine per visible GPU."""
    if num_gpus < 2:
        return []
    runs = [EngineRun("1 engine (cuda:0)", (), 1),
            EngineRun("2 engines (--devices cuda:0,cuda:1)", ("--devices", "cuda:0,cuda:1"), 2)]
    if num_gpus > 2:
        runs.append(EngineRun(f"{num_gpus} engines (--engines auto)", ("--engines", "auto"), num_gpus))
    return runs


def skipped_line(num_gpus: int) -> str:
    """What the step prints on a box it cannot measure."""
    what = "one GPU" if num_gpus == 1 else f"{num_gpus} GPUs"
    return f"several-device part skipped: this box has {what}; it runs where more than one GPU is visible"


def batches_by_engine(exposition: str) -> dict[str, float]:
    """``mmserve_batch_size_count`` summed over lanes by its ``engine`` label ("-" for series without one)."""
    counts: dict[str, float] = {}
    for labels, value in _BATCH_COUNT.findall(exposition):
        engine = _ENGINE_LABEL.search(labels)
        key = engine.group(1) if engine else "-"
        counts[key] = counts.get(key, 0.0) + float(value)
    return dict(sorted(counts.items()))


def serving_engines(models_answer: dict) -> int:
    """How many engines ``GET /v1/models`` says serve (its model's ``mmserve.engines``)."""
    (model,) = models_answer["data"]
    return sum(1 for engine in model.get("mmserve", {}).get("engines", ()) if engine.get("serving"))


def wait_for_engines(url: str, num_engines: int, timeout_s: float) -> float:
    """Seconds until ``/v1/models`` says ``num_engines`` engines serve: ready is 200 once one does, and the
    others may still be capturing their graphs. ``TimeoutError`` after ``timeout_s``."""
    import httpx

    started = time.monotonic()
    while serving_engines(httpx.get(f"{url}/v1/models", timeout=10).json()) < num_engines:
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"fewer than {num_engines} engines serve after {timeout_s:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - started


def serve_each(report: Report, args: argparse.Namespace, model_dir: Path, runs: Sequence[EngineRun],
               deadline: Deadline, device: str = "cuda") -> None:
    """Each of ``runs`` served at saturation, one after the other; a row and its checks for each.

    ``device``: ``cuda`` here; the tests run the same path on the CPU (``--devices cpu,cpu``).
    """
    from benchmarks.gpu.siglip_large import random_images

    wrk = find_wrk()
    if wrk is None:
        report.add(Row("engines", "all", "wrk", None, None, "skipped: no wrk (benchmarks/gpu/prepare_offline.sh)"))
        return
    body = kserve_uint8_body(random_images(args.rows_per_request, args.image_side, seed=11))
    env = {"MMSERVE_DTYPE": args.dtype, "MMSERVE_VISION_MAX_BATCH_SIZE": str(args.batch_size),
           "MMSERVE_VISION_MAX_QUEUE_SIZE": "4096", "MMSERVE_MAX_QUEUE_DELAY_MS": "2"}
    one_engine_per_s: float | None = None
    for run in runs:
        if deadline.remaining_s() < args.duration_s + 60:
            report.add(Row("engines", run.label, "wrk", None, None, "skipped: time budget"))
            continue
        started = time.monotonic()
        server = start_server(model_dir, env, ready_timeout_s=max(30.0, deadline.remaining_s() - args.duration_s),
                              device=device, extra_args=run.extra_args)
        connections = args.connections * run.num_engines
        try:
            wait_for_engines(server.url, run.num_engines, max(30.0, deadline.remaining_s() - args.duration_s))
            start_s = time.monotonic() - started
            threads = min(4, connections)  # wrk wants at least one connection per thread
            run_wrk(wrk, server.url, str(model_dir), body, connections, 2, threads)  # warm the connections
            result = run_wrk(wrk, server.url, str(model_dir), body, connections, args.duration_s, threads)
            exposition = scrape(server.url)
        finally:
            server.stop()
        images_per_s = result.images_per_s(args.rows_per_request)
        one_engine_per_s = one_engine_per_s or images_per_s
        report.add(Row("engines", run.label, "KServe v2 uint8 binary", None, images_per_s / one_engine_per_s,
                       f"{images_per_s:,.0f} img/s, {connections} in flight; p50 {result.p50_ms:.1f} ms p99 "
                       f"{result.p99_ms:.1f} ms; every engine serving {start_s:.0f}s after the start (ideal ratio "
                       f"{run.num_engines})"))
        by_engine = batches_by_engine(exposition)
        num_computing = len([count for count in by_engine.values() if count > 0])
        report.check(f"{run.label} every engine computed", "engines", num_computing == run.num_engines,
                     f"batches by engine {by_engine}")
        num_failed = result.num_non_2xx + result.num_socket_errors
        report.check(f"{run.label} non-2xx + socket errors", "engines", num_failed == 0,
                     f"{result.num_non_2xx} + {result.num_socket_errors}")
        compiles = metric_sum(exposition, "mmserve_cold_compiles_total") or 0.0
        report.check(f"{run.label} cold compiles after ready", "engines", compiles == 0, f"{compiles:.0f}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = served_arguments(__doc__.split("\n\n")[0], budget_s=240.0)
    parser.add_argument("--image-side", type=int, default=256, help="the model's input size (pixels sent as is)")
    parser.add_argument("--dtype", default="bfloat16")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if cuda_missing():
        return EXIT_NO_CUDA
    import torch

    num_gpus = torch.cuda.device_count()
    runs = engine_runs(num_gpus)
    if not runs:
        print(skipped_line(num_gpus))
        return 0
    from benchmarks.gpu.siglip_large import SIGLIP_LARGE_ID, model_directory

    deadline = Deadline(args.budget_s)
    report = Report()
    model_dir = model_directory(args.model_dir)
    serve_each(report, args, model_dir, runs, deadline)
    names = ", ".join(sorted({torch.cuda.get_device_name(index) for index in range(num_gpus)}))
    return report.finish(f"{num_gpus} x {names} | torch {torch.__version__} | {SIGLIP_LARGE_ID} shape, random weights, "
                         "bf16")


if __name__ == "__main__":
    sys.exit(main())
