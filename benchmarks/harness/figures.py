"""A benchmark's headline figures as a JSON result file, for ``benchmarks.headline`` to put in BENCHMARKS.md.

``--save-figures PATH`` (``add_save_figures_argument``) writes, after the
table, the figures it printed, rounded as printed, with each one's headline
row (a key of ``benchmarks.headline.ROWS``), and the run's date, machine,
command and commit. A file seeded from a pasted run also has ``"source"``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness.alternation import ServerRuns
from benchmarks.harness.comparison_table import Targets, verdicts
from benchmarks.harness.machine import cpu_model_name, num_usable_cpus, utc_now


@dataclass(frozen=True)
class Figure:
    """One printed figure: the headline row it answers, what it is, its value as printed, and its unit."""

    row: str
    name: str
    value: float | int | str
    unit: str


_run_stamp: dict[str, str] = {}  # the run's start and commit, taken when its arguments are declared


def add_save_figures_argument(parser: argparse.ArgumentParser) -> None:
    """Declare ``--save-figures PATH``, and note the run's start time and commit for the file.

    Both are taken now, as the run starts: a run takes minutes, and the date
    its table prints and the code that measured are the start's.
    """
    _run_stamp.update(date=utc_now(), commit=git_commit())
    parser.add_argument("--save-figures", type=Path, default=None, metavar="PATH",
                        help="also write the headline figures as JSON to PATH (benchmarks/results/, "
                             "read by python -m benchmarks.headline)")


def short_machine() -> str:
    """Architecture, ``lscpu`` model name and usable CPUs: the headline's machine column."""
    return f"{platform.machine()} {cpu_model_name()}, {num_usable_cpus()} CPUs"


def git_commit() -> str:
    """The checkout's short commit, ``+dirty`` when files (untracked ones too) differ from it; "unknown" outside git.

    The result files themselves do not count: writing one is what a run does.
    """
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", ".", ":!benchmarks/results"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}+dirty" if dirty else commit


def this_command() -> str:
    """The command line that ran this benchmark, as a user would type it."""
    argv = sys.argv[:]
    module = sys.modules["__main__"].__spec__
    head = ["python", "-m", module.name] if module is not None else ["python", argv[0]]
    return shlex.join(head + argv[1:])


def result_document(figures: list[Figure], *, date: str | None = None) -> dict[str, Any]:
    """``figures`` with the date, machine, command and commit: a result file's content."""
    return {"date": date or _run_stamp.get("date") or utc_now(), "machine": short_machine(), "command": this_command(),
            "commit": _run_stamp.get("commit") or git_commit(), "figures": [asdict(figure) for figure in figures]}


def save_figures(path: Path | None, figures: list[Figure], *, date: str | None = None) -> None:
    """Write ``result_document(figures)`` to ``path``; nothing when ``path`` is None."""
    if path is None:
        return
    document = result_document(figures, date=date)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"figures saved to {path}", file=sys.stderr)


def comparison_figures(row: str, runs: Mapping[str, ServerRuns], peer: str, ours: str) -> list[Figure]:
    """Ours' saturation and open-loop p99 over the peer's, rounded as ``format_comparison`` prints them."""
    judged = verdicts(runs[peer], runs[ours], Targets(0.0, float("inf")))
    return [Figure(row, f"saturation ok/s over {peer}'s", round(judged.throughput_ratio, 2), "x"),
            Figure(row, f"open-loop p99 over {peer}'s", round(judged.p99_ratio, 2), "x")]
