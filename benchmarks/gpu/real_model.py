"""A real family on the GPU: a random SigLIP at google/siglip-large-patch16-256's shape, raw and served.

``benchmarks/gpu/run.sh``, step 3; a section is skipped with a row once the
time budget is short: ``accuracy`` (bf16 and fp16 against fp32: cosine >=
0.999, score within 0.01 * exp(logit_scale) / 4), ``forward`` (transformers'
raw forward vs mmserve's ``encode_images``, eager and CUDA graphs),
``decode`` (nvJPEG vs Pillow on 16 threads, cosine >= 0.9999) and ``served``
(``gpu.served`` at saturation against the raw forward; no cold compile after
ready; the fp32 server also decodes JPEGs on the device, cosine >= 0.9999 to
Pillow's).

Exit status: 0 every check passed, 1 a check failed, 2 no CUDA.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.gpu.report import EXIT_NO_CUDA, Deadline, Report, Row, bench_ms, cuda_missing, per_s, run_section
from benchmarks.gpu.served import (
    find_wrk, kserve_uint8_body, metric_sum, metric_value, post_image_embeddings, run_wrk, scrape, served_arguments,
    start_server,
)
from benchmarks.gpu.siglip_large import SIGLIP_LARGE_ID, jpeg_bytes, model_directory, random_images

MIN_COSINE_HALF = 0.999
MIN_COSINE_DECODE = 0.9999
NUM_SERVED_DECODE_IMAGES = 8


@dataclasses.dataclass(frozen=True)
class DecodeReference:
    """JPEGs and the float32 embeddings of their Pillow-decoded pixels: what the served decode check compares with."""

    encoded: list[bytes]
    embeddings: Any  # (N, E) float32 numpy


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return served_arguments(__doc__.split("\n\n")[0], budget_s=200.0).parse_args(argv)


def _cosine_min(a: Any, b: Any) -> float:
    import torch.nn.functional as F

    return float(F.cosine_similarity(a.float(), b.float(), dim=-1).min())


def _check(report: Report, section: str, case: str, value: float, bound: float, is_min: bool = True) -> None:
    passed = value >= bound if is_min else value <= bound
    report.check(case, section, passed, f"{value:.6f} {'>=' if is_min else '<='} {bound}")


def _embed(bundle: Any, images: Any, texts: Sequence[str]) -> tuple[Any, Any, Any]:
    import torch

    model = bundle.model
    image_segments = model.encode_images(images)
    ids = [bundle.tokenizer.encode(t, truncate=True).token_ids for t in texts]
    text_segments = model.encode_texts(ids, pad_to=model.text.fixed_length, pad_token_id=bundle.tokenizer.pad_token_id)
    fused = model.fuse(image_segments[: len(texts)], text_segments)
    return (torch.stack([s.pooled for s in image_segments]), torch.stack([s.pooled for s in text_segments]),
            torch.stack([f.score for f in fused]))


def accuracy(report: Report, bundles: dict[str, Any], images: Any) -> None:
    import math

    texts = ["a photo of a cat", "two dogs playing on the grass", "a red bicycle", "the city skyline at night"]
    reference = _embed(bundles["float32"], images, texts)
    score_scale = math.exp(float(bundles["float32"].model.score.owner.logit_scale.detach()))
    for dtype in ("bfloat16", "float16"):
        ours = _embed(bundles[dtype], images, texts)
        _check(report, "accuracy", f"{dtype} image cosine", _cosine_min(ours[0], reference[0]), MIN_COSINE_HALF)
        _check(report, "accuracy", f"{dtype} text cosine", _cosine_min(ours[1], reference[1]), MIN_COSINE_HALF)
        _check(report, "accuracy", f"{dtype} score |diff|", float((ours[2] - reference[2]).abs().max()),
               0.01 * score_scale / 4, is_min=False)


def forward(report: Report, bundles: dict[str, Any], images: Any, batch_size: int) -> dict[str, float]:
    """Images/s per (dtype, path); returns the raw forward's ms per batch by dtype (the served rows' baseline)."""
    import torch

    from models.cuda_graphs import CudaGraphBackend
    from models.precision import torch_dtype

    raw_ms: dict[str, float] = {}
    batch = images[:batch_size].contiguous()  # (B, S, S, 3) uint8 on the device
    for dtype, bundle in bundles.items():
        if dtype == "float16":
            continue
        model = bundle.model
        preprocess = bundle.config.preprocess
        pixels = (batch.permute(0, 3, 1, 2).float() / 255 - 0.5) / 0.5  # (B, 3, S, S): mean = std = 0.5
        pixels = pixels.to(torch_dtype(dtype))
        hf_model = model.vision.model
        with torch.inference_mode():
            raw = bench_ms(lambda: hf_model.get_image_features(pixel_values=pixels))  # noqa: B023
            model.drop_encoder_graphs()
            eager = bench_ms(lambda: model.encode_images(batch))  # noqa: B023
            model.capture_encoder_graphs(lambda: CudaGraphBackend(model.device))  # noqa: B023
            model.encode_images(batch)  # captures this shape
            captured = bench_ms(lambda: model.encode_images(batch))  # noqa: B023
            text_rows = _time_texts(model, bundle.tokenizer.pad_token_id)
            model.drop_encoder_graphs()
        raw_ms[dtype] = raw
        report.add_timings("forward", f"SigLIP-L/16-256 B{batch_size} {dtype}", [
            ("transformers get_image_features", raw, per_s(batch_size, raw)),
            ("mmserve encode_images eager", eager, per_s(batch_size, eager) + f"; {preprocess.input_size}px uint8"),
            ("mmserve encode_images graphs", captured, per_s(batch_size, captured)),
        ])
        report.add_timings("forward", f"SigLIP-L text B8 x{model.text.fixed_length} {dtype}", text_rows)
    return raw_ms


def _time_texts(model: Any, pad_token_id: int) -> list[tuple[str, float | None, str]]:
    """A text batch from the graph just installed, then eager: whether the text tower captured, and the gain."""
    ids = [[5 + i] * (10 + i) for i in range(8)]  # padded rows: the masked path

    def encode() -> Any:
        return model.encode_texts(ids, pad_to=model.text.fixed_length, pad_token_id=pad_token_id)

    encode()  # captures this shape, or records why it cannot
    graph = model.text.graph
    note = "captured" if graph.captured_shapes else f"runs eager: {next(iter(graph.reasons.values()))[:90]}"
    captured = bench_ms(encode)
    model.text.graph = None
    return [("mmserve encode_texts eager", bench_ms(encode), ""), ("mmserve encode_texts graphs", captured, note)]


def decode(report: Report, bundle: Any, num_images: int = 64) -> DecodeReference:
    import numpy as np
    import torch

    from models.jpeg_decode import DeviceJpegDecoder, cpu_decode_to_input

    preprocess = bundle.config.preprocess
    encoded = jpeg_bytes(random_images(num_images, 512, seed=5))
    decoder = DeviceJpegDecoder(bundle.model.device, preprocess)
    device_ms = bench_ms(lambda: decoder.decode(encoded))
    with ThreadPoolExecutor(16) as pool:
        started = time.perf_counter()
        for _ in range(3):
            cpu = list(pool.map(lambda data: cpu_decode_to_input(data, preprocess), encoded))
        cpu_ms = (time.perf_counter() - started) / 3 * 1e3
    report.add_timings("decode", f"{num_images} JPEG 512px -> {preprocess.input_size}px", [
        ("Pillow, 16 threads", cpu_ms, per_s(num_images, cpu_ms)),
        ("nvJPEG batch + device resize", device_ms, per_s(num_images, device_ms)),
    ])
    from_device = decoder.decode(encoded)
    from_cpu = torch.from_numpy(np.stack(cpu)).to(bundle.model.device)  # (N, S, S, 3)
    from_pillow = torch.stack([s.pooled for s in bundle.model.encode_images(from_cpu)])  # (N, E)
    cosine = _cosine_min(torch.stack([s.pooled for s in bundle.model.encode_images(from_device)]), from_pillow)
    _check(report, "decode", "nvJPEG vs Pillow embedding cosine", cosine, MIN_COSINE_DECODE)
    num_served = NUM_SERVED_DECODE_IMAGES
    return DecodeReference(encoded[:num_served], from_pillow[:num_served].float().cpu().numpy())


def served_decode(report: Report, url: str, model_name: str, reference: DecodeReference) -> None:
    """The server's own ``--decode-device cuda`` path: one OpenAI call of JPEGs, against Pillow-decoded fp32."""
    import torch

    before = metric_value(scrape(url), 'mmserve_device_decode_images_total{outcome="decoded"}') or 0.0
    served = post_image_embeddings(url, model_name, reference.encoded)  # (N, E)
    after = metric_value(scrape(url), 'mmserve_device_decode_images_total{outcome="decoded"}') or 0.0
    cosine = _cosine_min(torch.from_numpy(served), torch.from_numpy(reference.embeddings))
    _check(report, "served", "served nvJPEG vs in-process Pillow cosine", cosine, MIN_COSINE_DECODE)
    _check(report, "served", "images the server decoded on the device", after - before, float(len(reference.encoded)))


def served(report: Report, args: argparse.Namespace, model_dir: Path, raw_ms: dict[str, float],
           deadline: Deadline, decode_reference: DecodeReference | None) -> None:
    wrk = find_wrk()
    if wrk is None:
        report.add(Row("served", "all", "wrk", None, None, "skipped: no wrk (benchmarks/gpu/prepare_offline.sh)"))
        return
    body = kserve_uint8_body(random_images(args.rows_per_request, 256, seed=9))
    # fp32 second: it also checks the served on-device decode, which needs fp32 to hold the 0.9999 bound.
    runs = [("bfloat16", "captured", {}), ("float32", "captured", {"MMSERVE_DECODE_DEVICE": "cuda"}),
            ("bfloat16", "eager", {"MMSERVE_CUDA_GRAPHS": "false", "MMSERVE_TORCHSCRIPT_ENCODERS": "false"})]
    for dtype, mode, extra in runs:
        if deadline.remaining_s() < args.duration_s + 60:
            report.add(Row("served", f"{dtype} {mode}", "wrk", None, None, "skipped: time budget"))
            continue
        env = {"MMSERVE_DTYPE": dtype, "MMSERVE_VISION_MAX_BATCH_SIZE": str(args.batch_size),
               "MMSERVE_VISION_MAX_QUEUE_SIZE": "4096", "MMSERVE_MAX_QUEUE_DELAY_MS": "2", **extra}
        started = time.monotonic()
        server = start_server(model_dir, env, ready_timeout_s=max(30.0, deadline.remaining_s() - args.duration_s))
        start_s = time.monotonic() - started
        try:
            if extra.get("MMSERVE_DECODE_DEVICE") == "cuda":
                if decode_reference is None:
                    report.add(Row("served", "decode", "check", None, None, "skipped: the decode section failed"))
                else:
                    run_section(report, "check",
                                lambda: served_decode(report, server.url, str(model_dir),  # noqa: B023
                                                      decode_reference))
            run_wrk(wrk, server.url, str(model_dir), body, args.connections, 2)  # warm the connections
            result = run_wrk(wrk, server.url, str(model_dir), body, args.connections, args.duration_s)
            exposition = scrape(server.url)
        finally:
            server.stop()
        images_per_s = result.images_per_s(args.rows_per_request)
        raw_per_s = args.batch_size / raw_ms[dtype] * 1e3 if dtype in raw_ms else None
        report.add(Row("served", f"{dtype} {mode}", "KServe v2 uint8 binary", None,
                       images_per_s / raw_per_s if raw_per_s else None,
                       f"{images_per_s:,.0f} img/s vs raw {raw_per_s or 0:,.0f}; p50 {result.p50_ms:.1f} ms p99 "
                       f"{result.p99_ms:.1f} ms; non-2xx {result.num_non_2xx}; start-up {start_s:.0f}s"))
        _check(report, "served", f"{dtype} {mode} non-2xx + socket errors",
               float(result.num_non_2xx + result.num_socket_errors), 0.0, is_min=False)
        _check(report, "served", f"{dtype} {mode} cold compiles after ready",
               metric_sum(exposition, "mmserve_cold_compiles_total") or 0.0, 0.0, is_min=False)
        memory = metric_sum(exposition, "mmserve_device_memory_bytes")
        _check(report, "served", f"{dtype} {mode} device memory on /metrics", 1.0 if memory else 0.0, 1.0)


def _in_process(report: Report, args: argparse.Namespace,
                model_dir: Path) -> tuple[dict[str, float], DecodeReference | None]:
    """The accuracy, forward and decode sections on models loaded in this process; the raw forward's ms by
    dtype and the decode section's reference for the served decode check (None if it failed)."""
    import torch

    from models.families.pretrained import load_pretrained
    from models.precision import torch_dtype

    float32 = load_pretrained(str(model_dir), device="cuda", dtype="float32")
    bundles = {"float32": float32}
    for dtype in ("bfloat16", "float16"):  # as finish_bundle casts: from the float32 weights
        half = dataclasses.replace(float32, model=copy.deepcopy(float32.model))
        half.model.to(torch_dtype(dtype))
        bundles[dtype] = half
    images = torch.from_numpy(random_images(max(args.batch_size, 16), 256)).cuda()  # (N, 256, 256, 3)
    raw_ms: dict[str, float] = {}
    run_section(report, "check", lambda: accuracy(report, bundles, images[:16]))
    run_section(report, "forward", lambda: raw_ms.update(forward(report, bundles, images, args.batch_size)))
    references: list[DecodeReference] = []
    run_section(report, "check", lambda: references.append(decode(report, float32)))
    return raw_ms, references[0] if references else None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if cuda_missing():
        return EXIT_NO_CUDA
    import torch

    deadline = Deadline(args.budget_s)
    report = Report()
    started = time.monotonic()
    model_dir = model_directory(args.model_dir)
    report.add(Row("build", SIGLIP_LARGE_ID, "random weights", None, None,
                   f"written in {time.monotonic() - started:.0f}s to {model_dir}"))
    raw_ms, decode_reference = _in_process(report, args, model_dir)
    torch.cuda.empty_cache()  # the in-process models are gone: the server gets the device
    run_section(report, "served", lambda: served(report, args, model_dir, raw_ms, deadline, decode_reference))
    return report.finish(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | {SIGLIP_LARGE_ID} shape, "
                         "random weights")


if __name__ == "__main__":
    sys.exit(main())
