"""Zero-shot classify: latency and throughput against an image-only request and the in-process pipeline.

    python -m benchmarks.classify [--model DIR] [--labels 10 100 1000] [--requests 50] [--concurrency 4]
    python -m benchmarks.classify --smoke          a tiny random SigLIP, a few requests: proves the script runs

One ``mmserve serve --model DIR`` process (a random SigLIP written with
``save_pretrained`` unless ``--model`` names one). For each label count it
measures, at the same closed-loop concurrency and with a new image per
request (so every request encodes its image):

    image-only   POST /v1/embeddings with the image (data: URI)
    cold         POST /v1/classify, labels no request sent before (every label encoded)
    warm         POST /v1/classify, the labels of a request already answered (every label cached)
    pipeline     transformers' pipeline("zero-shot-image-classification") in this process, one call per image

and prints p50 / p99 latency and throughput per row, then the two targets:
warm p50 at the largest label count <= 1.2x the image-only p50, and warm
throughput there >= 20x the pipeline's.
"""

from __future__ import annotations

import argparse
import base64
import io
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from benchmarks.random_pretrained import TowerSize, write_siglip
from benchmarks.harness.server_commands import mmserve_model_command
from benchmarks.harness.server_process import running

WARM_P50_RATIO_TARGET = 1.2  # warm classify p50 / image-only p50, at the largest label count
THROUGHPUT_RATIO_TARGET = 20.0  # warm classify throughput / the in-process pipeline's


@dataclass(frozen=True)
class Summary:
    """One row: how many requests, their p50 / p99 latency and the throughput over the row's wall time."""

    name: str
    num_labels: int
    num_requests: int
    p50_ms: float
    p99_ms: float
    throughput_rps: float


def percentile_ms(latencies_s: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-quantile (0 < q <= 1) of ``latencies_s``, in milliseconds."""
    if not latencies_s:
        raise ValueError("no latencies")
    ordered = sorted(latencies_s)
    rank = max(1, int(np.ceil(q * len(ordered))))
    return ordered[rank - 1] * 1e3


def summarise(name: str, num_labels: int, latencies_s: Sequence[float], wall_s: float) -> Summary:
    return Summary(name, num_labels, len(latencies_s), percentile_ms(latencies_s, 0.5), percentile_ms(latencies_s, 0.99),
                   len(latencies_s) / wall_s)


def target_lines(rows: Sequence[Summary]) -> list[str]:
    """The two targets at the largest label count, each with its measured ratio and a verdict."""
    top = max(row.num_labels for row in rows)
    by_name = {row.name: row for row in rows if row.num_labels == top}
    warm, image_only, reference = by_name["warm"], by_name["image-only"], by_name["pipeline"]
    latency_ratio = warm.p50_ms / image_only.p50_ms
    throughput_ratio = warm.throughput_rps / reference.throughput_rps
    return [
        f"warm p50 / image-only p50 at {top} labels: {latency_ratio:.2f} (target <= {WARM_P50_RATIO_TARGET}) "
        f"{'met' if latency_ratio <= WARM_P50_RATIO_TARGET else 'MISSED'}",
        f"warm throughput / pipeline throughput at {top} labels: {throughput_ratio:.1f} "
        f"(target >= {THROUGHPUT_RATIO_TARGET}) {'met' if throughput_ratio >= THROUGHPUT_RATIO_TARGET else 'MISSED'}",
    ]


def _png(seed: int, size_px: int = 64) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size_px, size_px, 3), dtype=np.uint8)  # (H, W, 3)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _closed_loop(send: Callable[[int], None], num_requests: int, concurrency: int) -> tuple[list[float], float]:
    """``send(i)`` for i < num_requests from ``concurrency`` threads; each latency and the wall time."""
    latencies: list[float] = [0.0] * num_requests

    def timed(index: int) -> None:
        started = time.perf_counter()
        send(index)
        latencies[index] = time.perf_counter() - started

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(timed, range(num_requests)))
    return latencies, time.perf_counter() - started


def _post(client: httpx.Client, path: str, body: dict) -> None:
    answer = client.post(path, json=body)
    if answer.status_code != 200:
        raise RuntimeError(f"{path} answered {answer.status_code}: {answer.text[:300]}")


def measure(url: str, model: Path, label_counts: Sequence[int], num_requests: int, concurrency: int) -> list[Summary]:
    from transformers import pipeline

    classifier = pipeline("zero-shot-image-classification", model=str(model), device="cpu")
    rows = []
    seed = iter(range(10**6))
    with httpx.Client(base_url=url, timeout=300, limits=httpx.Limits(max_connections=concurrency)) as client:
        for num_labels in label_counts:
            images = [base64.b64encode(_png(next(seed))).decode() for _ in range(num_requests)]
            latencies, wall_s = _closed_loop(lambda i: _post(client, "/v1/embeddings", {
                "input": [f"data:image/png;base64,{images[i]}"]}), num_requests, concurrency)
            rows.append(summarise("image-only", num_labels, latencies, wall_s))
            for kind in ("cold", "warm"):
                images = [base64.b64encode(_png(next(seed))).decode() for _ in range(num_requests)]
                label_sets = ([[f"thing {r} {j}" for j in range(num_labels)] for r in range(num_requests)]
                              if kind == "cold" else [[f"warm thing {j}" for j in range(num_labels)]] * num_requests)
                if kind == "warm":
                    primer = base64.b64encode(_png(next(seed))).decode()  # its own image: the measured ones stay new
                    _post(client, "/v1/classify", {"image": {"b64": primer}, "labels": label_sets[0]})
                latencies, wall_s = _closed_loop(lambda i: _post(client, "/v1/classify", {
                    "image": {"b64": images[i]}, "labels": label_sets[i]}), num_requests, concurrency)
                rows.append(summarise(kind, num_labels, latencies, wall_s))
            labels = [f"warm thing {j}" for j in range(num_labels)]
            pil_images = [Image.open(io.BytesIO(_png(next(seed)))).convert("RGB")
                          for _ in range(max(2, num_requests // 5))]
            classifier(pil_images[0], candidate_labels=labels)  # its first call sets things up: not measured
            latencies, wall_s = _closed_loop(lambda i: classifier(pil_images[i], candidate_labels=labels),
                                             len(pil_images), 1)
            rows.append(summarise("pipeline", num_labels, latencies, wall_s))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="a SigLIP or CLIP directory (default: a random SigLIP)")
    parser.add_argument("--labels", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, 10 and 30 labels, 6 requests")
    args = parser.parse_args(argv)
    if args.smoke:
        args.labels, args.requests, args.concurrency = [10, 30], 6, 2
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            size = TowerSize() if args.smoke else TowerSize(image_size=224, patch_size=16, hidden_size=384,
                                                            num_layers=6, num_heads=6, intermediate_size=1536,
                                                            projection_dim=384)
            model = write_siglip(Path(scratch) / "siglip", size, max_text_tokens=64)
        settings = {"MAX_LABELS_PER_REQUEST": str(max(args.labels))}
        with running(mmserve_model_command(model, settings, device=args.device)) as server:
            rows = measure(server.url, model, args.labels, args.requests, args.concurrency)
    print(f"{'row':<11} {'labels':>6} {'requests':>8} {'p50 ms':>9} {'p99 ms':>9} {'req/s':>8}")
    for row in rows:
        print(f"{row.name:<11} {row.num_labels:>6} {row.num_requests:>8} {row.p50_ms:>9.2f} {row.p99_ms:>9.2f} "
              f"{row.throughput_rps:>8.1f}")
    for line in target_lines(rows):
        print(line)


if __name__ == "__main__":
    main()
