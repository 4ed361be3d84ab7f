"""The table a peer comparison prints: both servers' pooled runs, their ratio, the target and the verdict.

Formatting and arithmetic over ``ServerRuns`` only (no I/O). Targets compare
ratios, never absolute times: the machines are shared and drift.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from benchmarks.harness.alternation import AlternationPlan, ServerRuns, run_orders
from benchmarks.harness.table_layout import align


@dataclass(frozen=True)
class Targets:
    """What ours must reach against the peer: throughput ratio at least, fixed-rate p99 ratio at most.

    Optionally a bound on ours' server CPU per answered request over the
    peer's: ``max_cpu_ratio``, with ``cpu_basis`` saying where a bound not
    fixed in advance comes from (e.g. ``"previous run"``). A basis without a
    ratio is a bound that could not be had (no previous run): shown, not judged.
    """

    min_throughput_ratio: float
    max_p99_ratio: float
    max_cpu_ratio: float | None = None
    cpu_basis: str = ""


@dataclass(frozen=True)
class Verdicts:
    """The ratios and whether each met its target (the CPU ones ``None`` where not measured or not set)."""

    throughput_ratio: float
    p99_ratio: float
    is_throughput_met: bool
    is_p99_met: bool
    cpu_ratio: float | None = None
    is_cpu_met: bool | None = None


def cpu_ratio(peer: ServerRuns, ours: ServerRuns) -> float | None:
    """Ours' server CPU per answered request over the peer's; ``None`` unless both recorded it."""
    if not (peer.has_cpu and ours.has_cpu) or peer.cpu_ms_per_request <= 0:
        return None
    return ours.cpu_ms_per_request / peer.cpu_ms_per_request


def verdicts(peer: ServerRuns, ours: ServerRuns, targets: Targets) -> Verdicts:
    throughput_ratio = ours.throughput_rps / peer.throughput_rps
    p99_ratio = ours.open_percentile_ms("p99_ms") / peer.open_percentile_ms("p99_ms")
    ratio = cpu_ratio(peer, ours)
    is_cpu_met = None if ratio is None or targets.max_cpu_ratio is None else ratio <= targets.max_cpu_ratio
    return Verdicts(throughput_ratio, p99_ratio, throughput_ratio >= targets.min_throughput_ratio,
                    p99_ratio <= targets.max_p99_ratio, ratio, is_cpu_met)


def verdict_text(is_met: bool | None) -> str:
    if is_met is None:
        return "-"
    return "met" if is_met else "NOT met"


def cpu_target_text(targets: Targets) -> str:
    """The CPU target's cell: ``<= 0.60``, ``<= 0.81 (previous run)``, ``<= previous run (none)`` or ``-``."""
    if targets.max_cpu_ratio is None:
        return f"<= {targets.cpu_basis} (none)" if targets.cpu_basis else "-"
    basis = f" ({targets.cpu_basis})" if targets.cpu_basis else ""
    return f"<= {targets.max_cpu_ratio:.2f}{basis}"


def _cpu_rows(theirs: ServerRuns, mine: ServerRuns, judged: Verdicts, targets: Targets) -> list[tuple[str, ...]]:
    """Server CPU per answered request and cores used at saturation, where both servers' runs recorded them."""
    if judged.cpu_ratio is None:
        return []
    return [
        ("  server CPU ms per answered request", f"{theirs.cpu_ms_per_request:.2f}", f"{mine.cpu_ms_per_request:.2f}",
         f"{judged.cpu_ratio:.2f}", cpu_target_text(targets), verdict_text(judged.is_cpu_met)),
        ("  server CPUs busy", f"{theirs.server_cores:.2f}", f"{mine.server_cores:.2f}",
         f"{mine.server_cores / theirs.server_cores:.2f}" if theirs.server_cores > 0 else "-", "-", "-"),
    ]


def _worst_ms(values_ms: Sequence[float]) -> str:
    return f"{max(values_ms):.1f}" if values_ms else "-"


def format_comparison(title: str, runs: Mapping[str, ServerRuns], peer: str, ours: str, plan: AlternationPlan,
                      targets: Targets, num_cpus: int, ratio_label: str, generator: str = "closed loop") -> str:
    """``title``, the run orders, then one row per figure with ``ratio_label`` (ours/peer) and the verdicts."""
    theirs, mine = runs[peer], runs[ours]
    rate_rps = plan.fixed_rate_share * theirs.throughput_rps
    judged = verdicts(theirs, mine, targets)
    their_per_cpu = theirs.throughput_per_free_cpu_rps(num_cpus)
    my_per_cpu = mine.throughput_per_free_cpu_rps(num_cpus)
    p50_ratio = mine.open_percentile_ms("p50_ms") / theirs.open_percentile_ms("p50_ms")
    rows = [
        ("metric", peer, ours, ratio_label, "target", "verdict"),
        (f"saturation ok/s ({generator}, C={plan.concurrency})", f"{theirs.throughput_rps:.1f}",
         f"{mine.throughput_rps:.1f}", f"{judged.throughput_ratio:.2f}", f">= {targets.min_throughput_ratio:.2f}",
         verdict_text(judged.is_throughput_met)),
        ("  same, per CPU other processes left free", f"{their_per_cpu:.2f}", f"{my_per_cpu:.2f}",
         f"{my_per_cpu / their_per_cpu:.2f}", "-", "-"),
        *_cpu_rows(theirs, mine, judged, targets),
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


def format_saturation(title: str, runs: Mapping[str, ServerRuns], plan: AlternationPlan, generator: str) -> str:
    """Saturation alone, one column per server (no peer to take a ratio to): answers/s, CPU per answer, errors."""
    names = list(runs)
    rows = [
        ("metric", *names),
        (f"saturation ok/s ({generator}, C={plan.concurrency})", *(f"{runs[n].throughput_rps:.1f}" for n in names)),
        ("  server CPU ms per answered request", *(f"{runs[n].cpu_ms_per_request:.2f}" for n in names)),
        ("  server CPUs busy", *(f"{runs[n].server_cores:.2f}" for n in names)),
        ("CPUs other processes took during the runs (mean)",
         *(f"{statistics.fmean(runs[n].other_cpus):.2f}" for n in names)),
        ("errors", *(", ".join(f"{k} {v}" for k, v in sorted(runs[n].errors.items())) or "0" for n in names)),
    ]
    rounds = f"{plan.num_rounds} round{'' if plan.num_rounds == 1 else 's'}"
    lines = [f"{title}: {plan.seconds:g} s per run, {rounds} (each server's runs pooled)"]
    return "\n".join(lines + align(rows))
