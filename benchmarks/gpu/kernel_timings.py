"""Kernel timings: the fused attention and preprocessing against torch, the host-to-device copy, LayerNorm.

Times are medians from ``triton.testing.do_bench`` in milliseconds.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from benchmarks.gpu.report import IMAGENET_MEAN, IMAGENET_STD, Deadline, Report, bench_ms, offsets, time_compiled

def time_attention(report: Report, args: argparse.Namespace) -> None:
    import numpy as np

    rng = np.random.default_rng(args.seed)
    for num_items in args.batch_sizes:
        lengths = [int(n) for n in rng.integers(1, args.max_text_len + 1, num_items)]
        lengths[0] = args.max_text_len
        _time_attention_case(report, args, lengths)


def _time_attention_case(report: Report, args: argparse.Namespace, lengths: list[int]) -> None:
    import torch
    import torch.nn.functional as F

    from kernels import lowrank_cross_attention

    rank, value_dim, seqlen_k, dtype = args.rank, args.value_dim, args.image_tokens, torch.bfloat16
    num_items, total, max_len = len(lengths), sum(lengths), max(lengths)
    scale = rank**-0.5
    q = torch.randn(total, rank, device="cuda", dtype=dtype)  # (T, r)
    k = torch.randn(num_items, seqlen_k, rank, device="cuda", dtype=dtype)  # (B, Lv, r)
    v = torch.randn(num_items, seqlen_k, value_dim, device="cuda", dtype=dtype)  # (B, Lv, d)
    cu_host, cu_dev = offsets(lengths), offsets(lengths).cuda()
    out = torch.empty(total, value_dim, device="cuda", dtype=dtype)  # (T, d)
    q_pad = torch.zeros(num_items, max_len, rank, device="cuda", dtype=dtype)  # (B, Lt_max, r)
    k_t = k.transpose(1, 2)  # (B, r, Lv)

    def eager_padded() -> Any:
        return torch.bmm(torch.softmax(torch.bmm(q_pad, k_t) * scale, dim=-1), v)  # (B, Lt_max, d)

    def sdpa_padded() -> Any:
        return F.scaled_dot_product_attention(q_pad[:, None], k[:, None], v[:, None], scale=scale)

    timings: list[tuple[str, float | None, str]] = [("torch eager (padded)", bench_ms(eager_padded), "")]
    try:
        timings.append(("sdpa (padded)", bench_ms(sdpa_padded), ""))
    except RuntimeError as e:  # no SDPA backend for r != d on this build
        timings.append(("sdpa (padded)", None, f"n/a: {str(e).splitlines()[0][:60]}"))
    def fused(cu: Any) -> Callable[[], Any]:
        return lambda: lowrank_cross_attention(q, cu, k, v, backend="triton", out=out)

    timings += [
        ("torch ref (packed)", bench_ms(lambda: lowrank_cross_attention(q, cu_host, k, v, backend="torch")), ""),
        ("triton (cu on host)", bench_ms(fused(cu_host)), ""),
        ("triton (cu on device)", bench_ms(fused(cu_dev)), "includes one host read of cu"),
    ]
    report.add_timings("attention", f"B{num_items} T{total} pad{num_items * max_len}", timings)


def time_preprocess(report: Report, args: argparse.Namespace) -> None:
    for num_images in args.batch_sizes:
        _time_preprocess_case(report, num_images)


def _time_preprocess_case(report: Report, num_images: int) -> None:
    import torch

    from kernels import preprocess_uint8

    mean = torch.tensor(IMAGENET_MEAN, device="cuda").view(1, 3, 1, 1)  # (1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device="cuda").view(1, 3, 1, 1)  # (1, 3, 1, 1)
    images = torch.randint(0, 256, (num_images, 224, 224, 3), device="cuda", dtype=torch.uint8)
    out = torch.empty(num_images, 3, 224, 224, device="cuda", dtype=torch.bfloat16)  # (B, 3, H, W)

    def eager() -> Any:
        planar = images.permute(0, 3, 1, 2).float()  # (B, 3, H, W)
        return ((planar / 255.0 - mean) / std).to(torch.bfloat16).contiguous()

    def fused() -> Any:
        return preprocess_uint8(images, IMAGENET_MEAN, IMAGENET_STD, torch.bfloat16, backend="triton", out=out)

    timings = [("torch eager", bench_ms(eager), ""), ("triton", bench_ms(fused), "")]
    report.add_timings("preprocess", f"B{num_images} 224x224 -> bf16", timings)


def time_host_to_device(report: Report, args: argparse.Namespace) -> None:
    import torch

    for num_images in args.batch_sizes:
        timings = [
            _time_copy("float32 (B,3,H,W)", (num_images, 3, 224, 224), torch.float32),
            _time_copy("uint8 (B,H,W,3)", (num_images, 224, 224, 3), torch.uint8),
        ]
        report.add_timings("h2d", f"B{num_images} 224x224", timings)


def _time_copy(name: str, shape: tuple[int, ...], dtype: Any) -> tuple[str, float | None, str]:
    import torch

    host = torch.zeros(shape, dtype=dtype).pin_memory()
    device = torch.empty(shape, dtype=dtype, device="cuda")
    ms = bench_ms(lambda: device.copy_(host, non_blocking=True))
    size_bytes = host.numel() * host.element_size()
    return name, ms, f"{size_bytes / 1e6:.1f} MB, {size_bytes / ms / 1e6:.1f} GB/s"


def time_layernorm(report: Report, args: argparse.Namespace, deadline: Deadline) -> None:
    import torch
    import torch.nn.functional as F

    width = args.fusion_width
    weight = torch.randn(width, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(width, device="cuda", dtype=torch.bfloat16)

    def add_norm(x: Any, residual: Any) -> Any:
        return F.layer_norm(x + residual, (width,), weight, bias)

    compiled = None if args.skip_compile else torch.compile(add_norm, dynamic=False)
    for num_items in args.batch_sizes:
        x = torch.randn(num_items, width, device="cuda", dtype=torch.bfloat16)  # (B, width)
        residual = torch.randn_like(x)
        scratch = torch.empty_like(x)
        timings: list[tuple[str, float | None, str]] = [
            ("eager add + layer_norm", bench_ms(lambda: add_norm(x, residual)), "2 kernels"),  # noqa: B023
            ("one bare launch (add)", bench_ms(lambda: torch.add(x, residual, out=scratch)), "1-kernel floor"),  # noqa: B023
        ]
        timings.append(time_compiled("torch.compile", compiled, (x, residual), deadline, 60.0, num_items=None))
        report.add_timings("layernorm", f"B{num_items} x {width} bf16", timings)
