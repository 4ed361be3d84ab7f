"""The GPU benchmark's table: rows in measurement order, the time budget, and how a case is timed.

Every row is echoed to stderr as it is measured, so a run cut short still
shows what it got; ``print_table`` prints them all at the end.
"""

from __future__ import annotations

import itertools
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

    def check(self, case: str, impl: str, is_passed: bool, note: str) -> None:
        """A check's row, PASS or FAIL, counted when it fails."""
        self.num_failed_checks += 0 if is_passed else 1
        self.add(Row("check", case, impl, None, None, f"{'PASS' if is_passed else 'FAIL'} {note}"))

    def finish(self, header: str, checks: str = "check(s)") -> int:
        """``header`` and the table on stdout; the exit status (1 where a check failed)."""
        print(header)
        self.print_table()
        if self.num_failed_checks:
            print(f"{self.num_failed_checks} {checks} FAILED", file=sys.stderr)
            return EXIT_CHECK_FAILED
        return 0

    def print_table(self) -> None:
        header = f"{'section':<11}{'case':<26}{'impl':<24}{'median_ms':>11}{'speedup':>9}  note"
        print(header)
        print("-" * len(header))
        for r in self.rows:
            speedup = f"{r.speedup:.2f}x" if r.speedup is not None else ""
            print(f"{r.section:<11}{r.case:<26}{r.impl:<24}{_fmt_ms(r.median_ms):>11}{speedup:>9}  {r.note}")


def cuda_missing() -> bool:
    """True, with the error line on stderr, where torch sees no CUDA device (exit with ``EXIT_NO_CUDA``)."""
    import torch

    if torch.cuda.is_available():
        return False
    print("error: CUDA is not available (torch.cuda.is_available() is False); this benchmark needs a GPU",
          file=sys.stderr)
    return True


class Deadline:
    """The run's time budget; expensive steps ask before they start."""

    def __init__(self, budget_s: float) -> None:
        self.end_s = time.monotonic() + budget_s

    def remaining_s(self) -> float:
        return self.end_s - time.monotonic()


def _fmt_ms(ms: float | None) -> str:
    return "" if ms is None else f"{ms:.4f}"


def bench_ms(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def offsets(lengths: Sequence[int]) -> Any:
    import torch

    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)  # (B + 1,)


def time_compiled(
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
    throughput = f"{per_s(num_items, ms)}; " if num_items is not None else ""
    return name, ms, f"{throughput}compile {compile_s:.0f}s"


def per_s(num_images: int, ms: float) -> str:
    return f"{num_images / ms * 1e3:,.0f} img/s"


def run_section(report: Report, name: str, section: Callable[[], None]) -> None:
    """One section's failure becomes a row (a failed check if it is a check) and the run goes on."""
    import traceback

    try:
        section()
    except Exception as e:  # noqa: BLE001 - a one-shot run reports every section it can
        traceback.print_exc(file=sys.stderr)
        if name == "check":
            report.num_failed_checks += 1
        report.add(Row(name, "(section)", "error", None, None, f"FAIL {type(e).__name__}: {str(e)[:80]}"))
