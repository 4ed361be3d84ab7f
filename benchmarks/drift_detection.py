"""Drift detection of ``monitoring.Monitor`` on a simulated clock: false alarms and the delay to a real shift.

Feeds the package directly (no server): the simulated traffic of
``benchmarks.drift_traffic`` through ``Monitor.record`` and ``Monitor.tick``,
one simulated second at a time, default ``MonitorConfig``. Scenarios:

  stationary   10 min baseline, then 60 min of the same traffic: count alarms.
  stall        after the baseline, 20 % of batches that run the vision
               encoder take 172 ms longer: periods to detection per route, and the stage named.
  creep        the vision stage's spread widens over 10 minutes (median fixed)
               until the vision route's P99 is 10 % higher: when drift is raised, and the P99 then.

    python -m benchmarks.drift_detection [--minutes 60] [--seed 0] [--scenarios stall ...] [--save-figures PATH]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.drift_traffic import (
    RATES, VISION_SIGMA, Simulation, calibrate_creep_sigma, new_simulation, p99_total_vision,
)
from benchmarks.harness import label_and_text
from benchmarks.harness.figures import Figure, add_save_figures_argument, save_figures
from monitoring import DriftState, MonitorConfig


def scenario_stationary(seed: int, minutes: int, figures: list[Figure]) -> list[tuple[str, str]]:
    sim = new_simulation(seed)
    alarms: list[str] = []
    max_ks: dict[str, float] = {}
    max_over_floor: dict[str, float] = {}
    shifted_periods = 0
    judged = 0

    def on_period(s: Simulation) -> None:
        nonlocal shifted_periods, judged
        for route, status in s.monitor.drift_status().items():
            total = status.verdicts.get("total")
            if total is None:
                continue
            judged += total.is_judged
            shifted_periods += bool(status.condition)
            max_ks[route] = max(max_ks.get(route, 0.0), total.ks)
            max_over_floor[route] = max(max_over_floor.get(route, 0.0), total.ks / total.noise_floor)
            if status.state is DriftState.DRIFTING:
                alarms.append(route)

    started = time.perf_counter()
    sim.run(minutes * 60, on_period)
    elapsed = time.perf_counter() - started
    ks_text = ", ".join(f"{r} {v:.4f}" for r, v in sorted(max_ks.items()))
    floor_text = ", ".join(f"{r} {v:.2f}" for r, v in sorted(max_over_floor.items()))
    figures.append(Figure("drift_delay", f"false alarm periods in {minutes} min stationary", len(alarms), ""))
    return [
        (f"stationary {minutes} min, 3 routes",
         f"false alarms: {len(set(alarms))} routes / {len(alarms)} periods drifting"),
        ("", f"periods judged: {judged} (route x period); single shifted periods: {shifted_periods}"),
        ("", f"max D(total): {ks_text}"),
        ("", f"max D(total) / its noise floor: {floor_text}"),
        ("", f"simulated {minutes * 60 + 630} s of traffic in {elapsed:.1f} s wall"),
    ]


def scenario_stall(seed: int, figures: list[Figure]) -> list[tuple[str, str]]:
    sim = new_simulation(seed)
    sim.run(120)
    start_period = sim.periods
    detected: dict[str, tuple[int, str | None, float]] = {}

    def on_period(s: Simulation) -> None:
        for route, status in s.monitor.drift_status().items():
            if route not in detected and status.state is DriftState.DRIFTING:
                top = status.attribution.top_stage if status.attribution else None
                detected[route] = (s.periods - start_period, top, status.verdicts["total"].ks)

    sim.stall_fraction, sim.stall_s = 0.2, 0.172
    sim.run(300, on_period)
    rows = []
    period_s = sim.monitor.config.period_s
    for route in ("vision", "fusion", "text"):
        if route in detected:
            periods, stage, ks = detected[route]
            if route == "vision":
                figures.append(Figure("drift_delay", "vision stall +172 ms on 20 % of batches, raised after",
                                      round(periods * period_s), "s"))
            rows.append((f"  {route}", f"drift after {periods} periods ({periods * period_s:.0f} s), "
                                      f"stage={stage}, D(total)={ks:.3f}"))
        else:
            rows.append((f"  {route}", "no drift (route has no vision stage)" if route == "text" else "NOT detected"))
    status = sim.monitor.drift_status()["fusion"]
    separating = status.attribution.separating_segments if status.attribution else ()
    separated = ", ".join(f"{s.dimension}={s.value} (D {s.ks:.3f})" for s in separating)
    rows.append(("  fusion, separating segment", separated or "none"))
    return [(f"vision stall +172 ms on 20 % of batches", "")] + rows


def scenario_creep(seed: int, figures: list[Figure]) -> list[tuple[str, str]]:
    target_sigma, base_p99_ns = calibrate_creep_sigma(seed)
    sim = new_simulation(seed)
    sim.run(120)
    ramp_s = 600
    detected: dict[str, tuple[float, str | None, str, float]] = {}
    elapsed_s = 0

    def each_second(s: Simulation, second: int) -> None:
        nonlocal elapsed_s
        elapsed_s = second
        s.vision_sigma = VISION_SIGMA + (target_sigma - VISION_SIGMA) * min(second / ramp_s, 1.0)

    def on_period(s: Simulation) -> None:
        for route, status in s.monitor.drift_status().items():
            if route not in detected and status.state is DriftState.DRIFTING:
                total = status.verdicts["total"]
                rule = "+".join(r for r, on in (("ks", total.is_ks_shift), ("tail", total.is_tail_shift)) if on)
                top = status.attribution.top_stage if status.attribution else None
                detected[route] = (elapsed_s + 1, top, rule or "-", s.vision_sigma)

    sim.run(ramp_s + 300, on_period, each_second)
    rows = [(f"P99 creep +10 % over 10 min",
             f"vision sigma {VISION_SIGMA} -> {target_sigma:.3f}, median fixed; "
             f"base P99(total) {base_p99_ns / 1e6:.2f} ms")]
    for route in ("vision", "fusion"):
        if route not in detected:
            rows.append((f"  {route}", "NOT detected within 15 min"))
            continue
        at_s, stage, rule, sigma = detected[route]
        creep = p99_total_vision(sigma, np.random.default_rng(seed)) / base_p99_ns - 1
        note = " (P99 of the vision route)" if route == "fusion" else ""
        if route == "vision":
            figures.append(Figure("drift_delay", "P99 creep +10 % over 10 min, raised after", round(at_s / 60, 1), "min"))
        rows.append((f"  {route}", f"drift {at_s / 60:.1f} min after the creep began, "
                                   f"P99 then +{creep * 100:.1f} %{note}, rule={rule}, stage={stage}"))
    return rows


SCENARIOS = ("stationary", "stall", "creep")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=int, default=60, help="stationary minutes after the baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS),
                        help="which parts to run (default: all)")
    add_save_figures_argument(parser)
    args = parser.parse_args(argv)
    config = MonitorConfig()
    print(f"MonitorConfig: window {config.window_s:.0f} s / {config.num_sub_windows} sub-windows, "
          f"period {config.period_s:.0f} s, baseline {config.baseline_s:.0f} s, threshold {config.threshold}, "
          f"consecutive {config.consecutive}, min_samples {config.min_samples}, tail_ratio {config.tail_ratio}, "
          f"max_centroids {config.max_centroids}")
    print(f"traffic: {', '.join(f'{r} {n}/s' for r, n in RATES.items())}; simulated clock, 1 fold per simulated second")
    print()
    rows: list[tuple[str, str]] = []
    figures: list[Figure] = []
    if "stationary" in args.scenarios:
        rows += scenario_stationary(args.seed, args.minutes, figures)
    if "stall" in args.scenarios:
        rows += scenario_stall(args.seed + 1, figures)
    if "creep" in args.scenarios:
        rows += scenario_creep(args.seed + 2, figures)
    print(label_and_text(rows))
    save_figures(args.save_figures, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
