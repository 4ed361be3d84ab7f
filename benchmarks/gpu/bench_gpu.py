"""One-shot GPU check and benchmark of the kernels and the models' hot spots.

Run through ``benchmarks/gpu/run.sh`` (one command, under 8 minutes on one
H200; installs nothing). In order:

  check       both Triton kernels on CUDA against their torch references in
              float64 (fp32 to 1e-5 relative; bf16 within twice torch's own bf16
              error plus roundoff), outputs poisoned with NaN first; attention
              with dense keys and with ragged ones (0 to 4 images per text)
  attention   lowrank_cross_attention at serving shapes (B in 1..64, ragged
              Lt <= 77, Lv 197, r 16, d 1024, bf16): the Triton kernel on packed
              queries vs torch eager and scaled_dot_product_attention on padded
              queries (their best case: no packing cost)
  preprocess  preprocess_uint8 vs the same ops in torch eager on the GPU
  h2d         host-to-device copy of a pinned uint8 batch vs its float32 twin
  layernorm   residual add + LayerNorm at the fusion head's shape (B, 384):
              eager (two kernels) vs torch.compile (one) vs one bare launch,
              i.e. whether a fused kernel could pay
  vit         ViT-L/16 in bf16: eager, CUDA graph replay, torch.compile

Times are medians from ``triton.testing.do_bench`` in milliseconds. Every row
is also echoed to stderr as it is measured, so a run cut short still shows what
it got. Exit status: 0 all checks passed, 1 a check failed, 2 no CUDA.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

EXIT_CHECK_FAILED = 1
EXIT_NO_CUDA = 2
EXIT_INTERRUPTED = 124
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Row:
    section: str
    case: str
    impl: str
    median_ms: float | None  # None for checks and skipped rows
    speedup: float | None  # baseline_ms / median_ms within the case
    note: str


class Report:
    """Rows in measurement order; echoes each to stderr at once."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.num_failed_checks = 0

    def add(self, row: Row) -> None:
        self.rows.append(row)
        line = f"[{row.section}] {row.case} {row.impl}: {_fmt_ms(row.median_ms)} {row.note}"
        print(line, file=sys.stderr, flush=True)

    def add_timings(self, section: str, case: str, timings: Sequence[tuple[str, float | None, str]]) -> None:
        """The first timing is the case's baseline for the speedup column."""
        baseline_ms = timings[0][1]
        for impl, ms, note in timings:
            speedup = baseline_ms / ms if baseline_ms is not None and ms else None
            self.add(Row(section, case, impl, ms, speedup, note))

    def print_table(self) -> None:
        header = f"{'section':<11}{'case':<26}{'impl':<24}{'median_ms':>11}{'speedup':>9}  note"
        print(header)
        print("-" * len(header))
        for r in self.rows:
            speedup = f"{r.speedup:.2f}x" if r.speedup is not None else ""
            print(f"{r.section:<11}{r.case:<26}{r.impl:<24}{_fmt_ms(r.median_ms):>11}{speedup:>9}  {r.note}")


class Deadline:
    """The run's time budget; expensive steps ask before they start."""

    def __init__(self, budget_s: float) -> None:
        self.end_s = time.monotonic() + budget_s

    def remaining_s(self) -> float:
        return self.end_s - time.monotonic()


def _fmt_ms(ms: float | None) -> str:
    return "" if ms is None else f"{ms:.4f}"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--max-text-len", type=int, default=77, help="longest text (tokens); others drawn in [1, max]")
    parser.add_argument("--image-tokens", type=int, default=197, help="Lv: ViT-L/16 patches + class token")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--value-dim", type=int, default=1024, help="d: ViT-L width")
    parser.add_argument("--fusion-width", type=int, default=384, help="width of the fusion head's LayerNorm")
    parser.add_argument("--budget-s", type=float, default=400.0, help="skip remaining expensive steps after this")
    parser.add_argument("--skip-vit", action="store_true", help="leave out the ViT-L/16 section")
    parser.add_argument("--skip-compile", action="store_true", help="leave out every torch.compile row")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if min(args.batch_sizes) < 1 or max(args.batch_sizes) > 65535:
        parser.error("--batch-sizes must lie in [1, 65535]")
    if args.max_text_len < 1 or args.image_tokens < 1 or args.fusion_width < 1:
        parser.error("--max-text-len, --image-tokens and --fusion-width must be positive")
    if not 1 <= args.rank <= 64 or not 1 <= args.value_dim <= 4096:
        parser.error("--rank must lie in [1, 64] and --value-dim in [1, 4096]")
    if args.budget_s <= 0:
        parser.error("--budget-s must be positive")
    return args


def bench_ms(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _offsets(lengths: Sequence[int]) -> Any:
    import torch

    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)  # (B + 1,)


def check_attention(report: Report, args: argparse.Namespace) -> None:
    import torch

    from kernels import lowrank_cross_attention, lowrank_cross_attention_ref

    lengths = (1, 40, args.max_text_len, 0)
    for dtype in (torch.float32, torch.bfloat16):
        for rank in (8, 16, 32, 64):
            value_dim = args.value_dim if rank == args.rank else 64
            gen = torch.Generator(device="cuda").manual_seed(args.seed + rank)
            shape_q, shape_k = (sum(lengths), rank), (len(lengths), args.image_tokens, rank)
            q = torch.randn(shape_q, generator=gen, device="cuda", dtype=torch.float64)  # (T, r)
            k = torch.randn(shape_k, generator=gen, device="cuda", dtype=torch.float64)  # (B, Lv, r)
            v = torch.randn((*shape_k[:2], value_dim), generator=gen, device="cuda", dtype=torch.float64)  # (B, Lv, d)
            cu = _offsets(lengths).cuda()
            out = torch.full((sum(lengths), value_dim), float("nan"), device="cuda", dtype=dtype)  # (T, d)
            lowrank_cross_attention(q.to(dtype), cu, k.to(dtype), v.to(dtype), backend="triton", out=out)
            expected = lowrank_cross_attention_ref(q, cu, k, v)
            error = (out.double() - expected).abs().max().item()
            scale = expected.abs().max().item()
            if dtype == torch.float32:
                bound = 1e-5 * scale
            else:
                same_precision = lowrank_cross_attention_ref(q.to(dtype), cu, k.to(dtype), v.to(dtype))
                bound = 2 * (same_precision.double() - expected).abs().max().item()
                bound += torch.finfo(dtype).eps * scale
            _add_check(report, "attention", f"{str(dtype)[6:]} r{rank} d{value_dim}", error, bound, out)
        _check_attention_ragged(report, args, dtype)


def _check_attention_ragged(report: Report, args: argparse.Namespace, dtype: Any) -> None:
    """Packed keys (cu_seqlens_k): 1, 0, 4 and 2 images per text, one of them cut short."""
    import torch

    from kernels import lowrank_cross_attention, lowrank_cross_attention_ref

    lengths = (1, 40, args.max_text_len, 7)
    key_lengths = (args.image_tokens, 0, 4 * args.image_tokens, 2 * args.image_tokens - args.image_tokens // 2)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    q = torch.randn((sum(lengths), args.rank), generator=gen, device="cuda", dtype=torch.float64)  # (T, r)
    k = torch.randn((sum(key_lengths), args.rank), generator=gen, device="cuda", dtype=torch.float64)  # (Tk, r)
    v = torch.randn((sum(key_lengths), args.value_dim), generator=gen, device="cuda", dtype=torch.float64)  # (Tk, d)
    cu, cu_k = _offsets(lengths).cuda(), _offsets(key_lengths).cuda()
    out = torch.full((sum(lengths), args.value_dim), float("nan"), device="cuda", dtype=dtype)  # (T, d)
    lowrank_cross_attention(q.to(dtype), cu, k.to(dtype), v.to(dtype), cu_seqlens_k=cu_k, backend="triton", out=out)
    expected = lowrank_cross_attention_ref(q, cu, k, v, cu_seqlens_k=cu_k)
    error = (out.double() - expected).abs().max().item()
    scale = expected.abs().max().item()
    if dtype == torch.float32:
        bound = 1e-5 * scale
    else:
        same_precision = lowrank_cross_attention_ref(q.to(dtype), cu, k.to(dtype), v.to(dtype), cu_seqlens_k=cu_k)
        bound = 2 * (same_precision.double() - expected).abs().max().item() + torch.finfo(dtype).eps * scale
    _add_check(report, "attention", f"{str(dtype)[6:]} ragged keys {'/'.join(map(str, key_lengths))}", error, bound,
               out)


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
    passed = is_written and error <= bound
    report.num_failed_checks += 0 if passed else 1
    verdict = "PASS" if passed else "FAIL"
    unwritten = "" if is_written else " (unwritten/NaN elements)"
    report.add(Row("check", case, op, None, None, f"{verdict} max_err={error:.3g} bound={bound:.3g}{unwritten}"))


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
    cu_host, cu_dev = _offsets(lengths), _offsets(lengths).cuda()
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
        timings.append(_time_compiled("torch.compile", compiled, (x, residual), deadline, 60.0, num_items=None))
        report.add_timings("layernorm", f"B{num_items} x {width} bf16", timings)


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
                ("eager", eager_ms, _per_s(num_images, eager_ms)),
                ("eager + CUDA graph", graph_ms, _per_s(num_images, graph_ms) if graph_ms else "capture failed"),
                _time_compiled("torch.compile", compiled, (x,), deadline, 120.0, num_items=num_images),
            ]
            report.add_timings("vit", f"ViT-L/16 B{num_images} bf16", timings)


def _time_compiled(
    name: str,
    compiled: Callable[..., Any] | None,
    inputs: tuple[Any, ...],
    deadline: Deadline,
    min_remaining_s: float,
    num_items: int | None,
) -> tuple[str, float | None, str]:
    """First call compiles (timed apart); skipped when compile is off or the budget is short."""
    if compiled is None:
        return name, None, "skipped (--skip-compile)"
    if deadline.remaining_s() < min_remaining_s:
        return name, None, "skipped: time budget"
    started = time.monotonic()
    try:
        compiled(*inputs)
    except Exception as e:  # noqa: BLE001 - an inductor failure is a result to report, not a crash
        return name, None, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:60]}"
    compile_s = time.monotonic() - started
    ms = bench_ms(lambda: compiled(*inputs))
    throughput = f"{_per_s(num_items, ms)}; " if num_items is not None else ""
    return name, ms, f"{throughput}compile {compile_s:.0f}s"


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


def _per_s(num_images: int, ms: float) -> str:
    return f"{num_images / ms * 1e3:,.0f} img/s"


def _run_section(report: Report, name: str, run_section: Callable[[], None]) -> None:
    """One section's failure becomes a row (a failed check if it is a check) and the run goes on."""
    import traceback

    try:
        run_section()
    except Exception as e:  # noqa: BLE001 - a one-shot run reports every section it can
        traceback.print_exc(file=sys.stderr)
        if name == "check":
            report.num_failed_checks += 1
        report.add(Row(name, "(section)", "error", None, None, f"FAIL {type(e).__name__}: {str(e)[:80]}"))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: CUDA is not available (torch.cuda.is_available() is False); this benchmark needs a GPU",
              file=sys.stderr)
        return EXIT_NO_CUDA
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("error: TRITON_INTERPRET is set; unset it to benchmark compiled kernels", file=sys.stderr)
        return EXIT_NO_CUDA
    deadline = Deadline(args.budget_s)
    report = Report()
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | seed {args.seed}", file=sys.stderr)
    sections: list[tuple[str, Callable[[], None]]] = [
        ("check", lambda: check_attention(report, args)),
        ("check", lambda: check_preprocess(report, args)),
        ("attention", lambda: time_attention(report, args)),
        ("preprocess", lambda: time_preprocess(report, args)),
        ("h2d", lambda: time_host_to_device(report, args)),
        ("layernorm", lambda: time_layernorm(report, args, deadline)),
    ]
    if args.skip_vit:
        report.add(Row("vit", "ViT-L/16", "all", None, None, "skipped (--skip-vit)"))
    else:
        sections.append(("vit", lambda: time_vit(report, args, deadline)))
    try:
        for name, run_section in sections:
            _run_section(report, name, run_section)
    except KeyboardInterrupt:
        print("interrupted: the table below is partial", file=sys.stderr)
        report.print_table()
        return EXIT_INTERRUPTED
    import triton

    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__}")
    report.print_table()
    if report.num_failed_checks:
        print(f"{report.num_failed_checks} kernel check(s) FAILED", file=sys.stderr)
        return EXIT_CHECK_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
