"""The ViT-L/16 preset's image tower in bf16: eager, CUDA graph replay, torch.compile."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from benchmarks.gpu.report import Deadline, Report, bench_ms, per_s, time_compiled

def time_vit(report: Report, args: argparse.Namespace, deadline: Deadline) -> None:
    import timm
    import torch

    model = timm.create_model("vit_large_patch16_224", pretrained=False, num_classes=0)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    compiled = None if args.skip_compile else torch.compile(model, dynamic=False)
    with torch.inference_mode():
        for num_images in args.batch_sizes:
            x = torch.randn(num_images, 3, 224, 224, device="cuda", dtype=torch.bfloat16)  # (B, 3, H, W)
            eager_ms = bench_ms(lambda: model(x))  # noqa: B023
            graph_ms = _time_cuda_graph(model, x)
            timings: list[tuple[str, float | None, str]] = [
                ("eager", eager_ms, per_s(num_images, eager_ms)),
                ("eager + CUDA graph", graph_ms, per_s(num_images, graph_ms) if graph_ms else "capture failed"),
                time_compiled("torch.compile", compiled, (x,), deadline, 120.0, num_items=num_images),
            ]
            report.add_timings("vit", f"ViT-L/16 B{num_images} bf16", timings)


def _time_cuda_graph(model: Any, x: Any) -> float | None:
    import torch

    static_x = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            model(static_x)
    except RuntimeError as e:
        print(f"CUDA graph capture failed: {e}", file=sys.stderr)
        return None
    return bench_ms(graph.replay)
