"""One-shot GPU check and benchmark of the kernels and the models' hot spots (``benchmarks/gpu/run.sh``, step 2).

Sections, in order: ``check`` (both Triton kernels against their float64
torch references, outputs NaN-poisoned; dense and ragged keys), ``attention``
(the fused kernel vs torch eager and SDPA at serving shapes), ``preprocess``,
``h2d`` (pinned uint8 vs float32 copies), ``layernorm`` (eager vs
torch.compile vs one launch) and ``vit`` (ViT-L/16 bf16: eager, CUDA graph,
torch.compile). Medians of ``triton.testing.do_bench`` in ms; every row is
echoed to stderr as measured. Exit status: 0 passed, 1 a check failed, 2 no CUDA.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from benchmarks.gpu.kernel_checks import check_attention, check_preprocess
from benchmarks.gpu.kernel_timings import time_attention, time_host_to_device, time_layernorm, time_preprocess
from benchmarks.gpu.report import EXIT_INTERRUPTED, EXIT_NO_CUDA, Deadline, Report, Row, cuda_missing, run_section
from benchmarks.gpu.vit_preset import time_vit


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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if cuda_missing():
        return EXIT_NO_CUDA
    import torch

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
        for name, section in sections:
            run_section(report, name, section)
    except KeyboardInterrupt:
        print("interrupted: the table below is partial", file=sys.stderr)
        report.print_table()
        return EXIT_INTERRUPTED
    import triton

    return report.finish(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__}",
                         "kernel check(s)")


if __name__ == "__main__":
    sys.exit(main())
