"""Correctness checks of both Triton kernels on CUDA against their torch references in float64.

fp32 to 1e-5 relative; bf16 within twice torch's own bf16 error plus
roundoff; outputs poisoned with NaN first, so an unwritten element fails.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.gpu.report import IMAGENET_MEAN, IMAGENET_STD, Report, offsets

def check_attention(report: Report, args: argparse.Namespace) -> None:
    import torch

    from kernels import lowrank_cross_attention

    lengths = (1, 40, args.max_text_len, 0)
    for dtype in (torch.float32, torch.bfloat16):
        for rank in (8, 16, 32, 64):
            value_dim = args.value_dim if rank == args.rank else 64
            gen = torch.Generator(device="cuda").manual_seed(args.seed + rank)
            shape_q, shape_k = (sum(lengths), rank), (len(lengths), args.image_tokens, rank)
            q = torch.randn(shape_q, generator=gen, device="cuda", dtype=torch.float64)  # (T, r)
            k = torch.randn(shape_k, generator=gen, device="cuda", dtype=torch.float64)  # (B, Lv, r)
            v = torch.randn((*shape_k[:2], value_dim), generator=gen, device="cuda", dtype=torch.float64)  # (B, Lv, d)
            cu = offsets(lengths).cuda()
            out = torch.full((sum(lengths), value_dim), float("nan"), device="cuda", dtype=dtype)  # (T, d)
            lowrank_cross_attention(q.to(dtype), cu, k.to(dtype), v.to(dtype), backend="triton", out=out)
            error, bound = _attention_error_and_bound(out, q, cu, k, v, dtype)
            _add_check(report, "attention", f"{str(dtype)[6:]} r{rank} d{value_dim}", error, bound, out)
        _check_attention_ragged(report, args, dtype)


def _check_attention_ragged(report: Report, args: argparse.Namespace, dtype: Any) -> None:
    """Packed keys (cu_seqlens_k): 1, 0, 4 and 2 images per text, one of them cut short."""
    import torch

    from kernels import lowrank_cross_attention

    lengths = (1, 40, args.max_text_len, 7)
    key_lengths = (args.image_tokens, 0, 4 * args.image_tokens, 2 * args.image_tokens - args.image_tokens // 2)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    q = torch.randn((sum(lengths), args.rank), generator=gen, device="cuda", dtype=torch.float64)  # (T, r)
    k = torch.randn((sum(key_lengths), args.rank), generator=gen, device="cuda", dtype=torch.float64)  # (Tk, r)
    v = torch.randn((sum(key_lengths), args.value_dim), generator=gen, device="cuda", dtype=torch.float64)  # (Tk, d)
    cu, cu_k = offsets(lengths).cuda(), offsets(key_lengths).cuda()
    out = torch.full((sum(lengths), args.value_dim), float("nan"), device="cuda", dtype=dtype)  # (T, d)
    lowrank_cross_attention(q.to(dtype), cu, k.to(dtype), v.to(dtype), cu_seqlens_k=cu_k, backend="triton", out=out)
    error, bound = _attention_error_and_bound(out, q, cu, k, v, dtype, cu_seqlens_k=cu_k)
    _add_check(report, "attention", f"{str(dtype)[6:]} ragged keys {'/'.join(map(str, key_lengths))}", error, bound,
               out)


def _attention_error_and_bound(out: Any, q: Any, cu: Any, k: Any, v: Any, dtype: Any,
                               **keys: Any) -> tuple[float, float]:
    """The kernel's max error against the float64 reference, and its bound: fp32 1e-5 relative, else
    twice the same-precision torch error plus one eps of the output's scale."""
    import torch

    from kernels import lowrank_cross_attention_ref

    expected = lowrank_cross_attention_ref(q, cu, k, v, **keys)
    error = (out.double() - expected).abs().max().item()
    scale = expected.abs().max().item()
    if dtype == torch.float32:
        return error, 1e-5 * scale
    same_precision = lowrank_cross_attention_ref(q.to(dtype), cu, k.to(dtype), v.to(dtype), **keys)
    return error, 2 * (same_precision.double() - expected).abs().max().item() + torch.finfo(dtype).eps * scale


def check_preprocess(report: Report, args: argparse.Namespace) -> None:
    import torch

    from kernels import preprocess_uint8, preprocess_uint8_ref

    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    images = torch.randint(0, 256, (3, 224, 224, 3), generator=gen, device="cuda", dtype=torch.uint8)
    expected = preprocess_uint8_ref(images, IMAGENET_MEAN, IMAGENET_STD, torch.float64)
    for dtype in (torch.float32, torch.bfloat16):
        out = torch.full((3, 3, 224, 224), float("nan"), device="cuda", dtype=dtype)  # (B, 3, H, W)
        preprocess_uint8(images, IMAGENET_MEAN, IMAGENET_STD, dtype, backend="triton", out=out)
        error = (out.double() - expected).abs().max().item()
        if dtype == torch.float32:
            bound = 1e-5 * expected.abs().max().item()
        else:
            same_precision = preprocess_uint8_ref(images, IMAGENET_MEAN, IMAGENET_STD, dtype)
            bound = 2 * (same_precision.double() - expected).abs().max().item()
            bound += 0.5 * torch.finfo(dtype).eps * expected.abs().max().item()
        _add_check(report, "preprocess", f"{str(dtype)[6:]} 3x224x224", error, bound, out)


def _add_check(report: Report, op: str, case: str, error: float, bound: float, out: Any) -> None:
    import torch

    is_written = bool(torch.isfinite(out).all().item())
    unwritten = "" if is_written else " (unwritten/NaN elements)"
    report.check(case, op, is_written and error <= bound, f"max_err={error:.3g} bound={bound:.3g}{unwritten}")
