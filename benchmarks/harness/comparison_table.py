"""The table a peer comparison prints: both servers' pooled runs, their ratio, the target and the verdict.

Pure formatting and arithmetic over ``ServerRuns`` (no I/O), shared by
every comparison with a peer (``peer_litserve``, ``real_models``) and
tested on made-up runs. A target
compares ratios, never absolute times: the machines are shared and drift.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from benchmarks.harness.alternation import AlternationPlan, ServerRuns, run_orders
from benchmarks.harness.table_layout import align


@dataclass(frozen=True)
class Targets:
    """What ours must reach against the peer: throughput ratio at least, fixed-rate p99 ratio at most."""

    min_throughput_ratio: float
    max_p99_ratio: float


@dataclass(frozen=True)
class Verdicts:
    """The two ratios and whether each met its target."""

    throughput_ratio: float
    p99_ratio: float
    is_throughput_met: bool
    is_p99_met: bool


def verdicts(peer: ServerRuns, ours: ServerRuns, targets: Targets) -> Verdicts:
    throughput_ratio = ours.throughput_rps / peer.throughput_rps
    p99_ratio = ours.open_percentile_ms("p99_ms") / peer.open_percentile_ms("p99_ms")
    return Verdicts(throughput_ratio, p99_ratio, throughput_ratio >= targets.min_throughput_ratio,
                    p99_ratio <= targets.max_p99_ratio)


def verdict_text(is_met: bool) -> str:
    return "met" if is_met else "NOT met"


def _worst_ms(values_ms: Sequence[float]) -> str:
    return f"{max(values_ms):.1f}" if values_ms else "-"


def format_comparison(title: str, runs: Mapping[str, ServerRuns], peer: str, ours: str, plan: AlternationPlan,
                      targets: Targets, num_cpus: int, ratio_label: str) -> str:
    """``title``, the run orders, then one row per figure with ``ratio_label`` (ours/peer) and the verdicts."""
    theirs, mine = runs[peer], runs[ours]
    rate_rps = plan.fixed_rate_share * theirs.throughput_rps
    judged = verdicts(theirs, mine, targets)
    their_per_cpu = theirs.throughput_per_free_cpu_rps(num_cpus)
    my_per_cpu = mine.throughput_per_free_cpu_rps(num_cpus)
    p50_ratio = mine.open_percentile_ms("p50_ms") / theirs.open_percentile_ms("p50_ms")
    rows = [
        ("metric", peer, ours, ratio_label, "target", "verdict"),
        (f"saturation ok/s (closed loop, C={plan.concurrency})", f"{theirs.throughput_rps:.1f}",
         f"{mine.throughput_rps:.1f}", f"{judged.throughput_ratio:.2f}", f">= {targets.min_throughput_ratio:.2f}",
         verdict_text(judged.is_throughput_met)),
        ("  same, per CPU other processes left free", f"{their_per_cpu:.2f}", f"{my_per_cpu:.2f}",
         f"{my_per_cpu / their_per_cpu:.2f}", "-", "-"),
        (f"p50 ms at {rate_rps:.1f} req/s (open loop)", f"{theirs.open_percentile_ms('p50_ms'):.1f}",
         f"{mine.open_percentile_ms('p50_ms'):.1f}", f"{p50_ratio:.2f}", "-", "-"),
        (f"p99 ms at {rate_rps:.1f} req/s (open loop)", f"{theirs.open_percentile_ms('p99_ms'):.1f}",
         f"{mine.open_percentile_ms('p99_ms'):.1f}", f"{judged.p99_ratio:.2f}", f"<= {targets.max_p99_ratio:.2f}",
         verdict_text(judged.is_p99_met)),
        ("ok / sent at the fixed rate", f"{theirs.open_num_ok}/{theirs.open_num_sent}",
         f"{mine.open_num_ok}/{mine.open_num_sent}", "-", "-", "-"),
        ("generator p99 lag ms at the fixed rate (worst run)", _worst_ms(theirs.open_lag_p99_ms),
         _worst_ms(mine.open_lag_p99_ms), "-", "-", "-"),
        ("CPUs other processes took during the runs (mean)", f"{statistics.fmean(theirs.other_cpus):.2f}",
         f"{statistics.fmean(mine.other_cpus):.2f}", "-", "-", "-"),
    ]
    saturation_order, open_order = run_orders(plan.num_rounds, peer, ours)
    lines = [f"{title}: {plan.seconds:g} s per run; saturation runs {', '.join(saturation_order)}; "
             f"fixed-rate runs {', '.join(open_order)} (each server's runs pooled)"]
    lines += align(rows)
    lines.append("(generator lag: how late requests left against their Poisson schedule; the generator shares "
                 "the CPUs with the server, and above 20 ms it was itself short of CPU)")
    return "\n".join(lines)
