"""Tracing overhead: throughput and p99 with tracing off, on at 1 % sampling and on at 100 %, alternated.

Three ``mmserve serve`` processes of the same preset run side by side (four
with ``--base-commit``), all but one paused (SIGSTOP) while that one is measured:

    base    the build before tracing existed (``--base-commit REV``: ``git archive`` of it, run from a
            temporary directory), to show that "off" is today's build
    off     no OTEL_* variables: tracing=auto stays off
    0%      tracing on, nothing kept (MMSERVE_TRACE_SAMPLE_RATIO=0; ``--configs``): what being on
            costs every request, kept or not
    1%      OTLP/HTTP to a local sink, MMSERVE_TRACE_SAMPLE_RATIO=0.01
    100%    the same, MMSERVE_TRACE_SAMPLE_RATIO=1

The sink (``benchmarks.otlp_sink``, its own process) accepts and discards,
so the server pays the real export cost. The slow-request rule is off
(``MMSERVE_TRACE_SLOW_MS=0``): on a CPU every vit-b16 request is "slow",
and the rule would turn 1 % into 100 %. Each round measures every
configuration once, in a rotated order, so the machine's drift falls on all
three alike; the table gives the median over rounds of

    closed loop   saturation throughput (C clients back to back) and its p99
    open loop     p99 at a fixed Poisson rate below saturation (latency from the intended send time)
    cpu/req       the server's CPU time (user + system, all its threads) per answered request in
                  the closed loop: the work each request cost, whatever share of the cores the
                  server got beside the load generator (it still moves with the machine's
                  speed and from one server process to the next)

and each configuration's throughput and CPU per request relative to "off" in
the same round (median of the per-round ratios). Targets: off
indistinguishable from the build before tracing existed (base); 1 % costs
<= 2 % throughput.

    python -m benchmarks.tracing_overhead --presets tiny vit-b16 --base-commit e4fa521
    python -m benchmarks.tracing_overhead --presets tiny --base-commit e4fa521 --fresh-servers --rounds 4
    python -m benchmarks.tracing_overhead --presets tiny --fresh-servers --configs off 0% 1%
    python -m benchmarks.tracing_overhead --presets tiny --configs off 0% 1% --rounds 30 --restart-every 5 --seconds 3

Each ratio to off also gets a confidence interval (printed under the
table), over the sets of servers: two starts of the same build differ by up
to 10 % in throughput on a shared 2-core guest, so rounds on one set of
servers are not independent, and telling a 2 % cost apart this way takes
more restarts than a benchmark run can afford (``benchmarks.tracing_cpu_share``
measures tracing's share of the time instead).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
from collections.abc import Sequence

import torch

from benchmarks.harness import (
    CpuMeter, ServerProcess, fixed_width, mean_interval, paused_servers, resumed, rotated, run_report, utc_now,
)
from benchmarks.loadgen.config import RunMode
from benchmarks.tracing_setup import (
    PLANS, SAMPLE_RATIOS, TRACED_CONFIGS, PresetPlan, base_source, bench_config, otlp_sink, server_command,
    sink_stats,
)
from models.loading.repository import build_preset


def measure_once(server: ServerProcess, plan: PresetPlan, image_px: int, seed: int) -> dict[str, float]:
    """One closed loop then one open loop; also the server's CPU time per answered request in the closed loop.

    CPU per request (from ``/proc``) is each request's work, whatever share
    of the two cores the server got beside the load generator.
    """
    with resumed(server):
        meter = CpuMeter(server)
        closed = run_report(bench_config(server.url, plan, image_px, RunMode.CLOSED, seed))
        closed_cpu = meter.stop()
        opened = run_report(bench_config(server.url, plan, image_px, RunMode.OPEN, seed))
    return {"rps": closed["throughput_rps"], "closed_p99_ms": closed["p99_ms"], "open_p99_ms": opened["p99_ms"],
            "cpu_ms": closed_cpu.server_ms_per_request(closed["ok"]),
            "errors": closed["errors"] + opened["errors"], "behind": float(bool(opened.get("generator_bottleneck")))}


def measure_preset(plan: PresetPlan, num_rounds: int, configs: Sequence[str],
                   base_dir: str | None, restart_every: int | None = None) -> dict[str, dict[str, float]]:
    """Every configuration once per round, in a rotated order.

    ``restart_every``: start every configuration's server anew after that
    many rounds (1: a fresh server for every measurement; ``None``: one
    server each for all rounds), so a difference between two server
    processes (memory layout, what their warm-up left behind) falls on every
    configuration alike instead of sticking to one. A set's servers are all
    started before its rounds, one at a time (warm-ups would compete for the
    cores), and paused between their measurements.
    """
    image_px = build_preset(plan.preset).config.preprocess.input_size
    rows: dict[str, list[dict[str, float]]] = {config: [] for config in configs}
    rounds_per_set = restart_every or num_rounds
    with otlp_sink() as sink_url:
        exported_before = sink_stats(sink_url)
        for first_round in range(0, num_rounds, rounds_per_set):
            commands = {config: server_command(config, plan, sink_url, base_dir) for config in configs}
            with paused_servers(commands) as servers:
                for round_index in range(first_round, min(first_round + rounds_per_set, num_rounds)):
                    for config in rotated(configs, round_index):
                        rows[config].append(measure_once(servers[config], plan, image_px, seed=round_index))
        exported = sink_stats(sink_url)
    summary: dict[str, dict[str, float]] = {}
    for config in configs:
        runs = rows[config]
        rps_ratios = [r["rps"] / off["rps"] for r, off in zip(runs, rows["off"])]
        # Rounds on the same servers share those processes' luck (two starts of one build differ by up
        # to 10 %): the interval is over each set of servers' mean ratio, not over rounds.
        set_ratios = [statistics.fmean(rps_ratios[i:i + rounds_per_set])
                      for i in range(0, len(rps_ratios), rounds_per_set)]
        summary[config] = {
            "rps": statistics.median(r["rps"] for r in runs),
            "closed_p99_ms": statistics.median(r["closed_p99_ms"] for r in runs),
            "open_p99_ms": statistics.median(r["open_p99_ms"] for r in runs),
            "vs_off": statistics.median(rps_ratios),
            "vs_off_interval": mean_interval(set_ratios),  # type: ignore[dict-item]
            "num_server_sets": len(set_ratios),
            "cpu_ms": statistics.median(r["cpu_ms"] for r in runs),
            "cpu_vs_off": statistics.median(r["cpu_ms"] / off["cpu_ms"] for r, off in zip(runs, rows["off"])),
            "rounds_rps": [r["rps"] for r in runs],  # type: ignore[dict-item]
            "rounds_cpu_ms": [r["cpu_ms"] for r in runs],  # type: ignore[dict-item]
            "errors": sum(r["errors"] for r in runs),
            "behind": sum(r["behind"] for r in runs),
        }
    summary["sink"] = {"requests": exported["requests"] - exported_before["requests"],
                       "bytes": exported["bytes"] - exported_before["bytes"]}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny", "vit-b16"], choices=sorted(PLANS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fresh-servers", action="store_true",
                        help="start every configuration's server anew for each measurement (--restart-every 1)")
    parser.add_argument("--restart-every", type=int,
                        help="start every configuration's server anew after this many rounds")
    parser.add_argument("--seconds", type=float, help="override each phase's duration")
    parser.add_argument("--base-commit", help="also serve this commit (the build before tracing) as 'base'")
    parser.add_argument("--configs", nargs="+", choices=["off", *SAMPLE_RATIOS], default=list(TRACED_CONFIGS),
                        help="the configurations besides 'base' ('off' is always measured: ratios are against it)")
    args = parser.parse_args()
    restart_every = 1 if args.fresh_servers else args.restart_every
    configs = (("base",) if args.base_commit else ()) + ("off",) + tuple(c for c in args.configs if c != "off")
    print(f"tracing overhead, {utc_now()}, {platform.machine()} "
          f"x{torch.get_num_threads()} torch threads, torch {torch.__version__}, python {platform.python_version()}, "
          f"{args.rounds} rounds (order rotated), {servers_said(restart_every)}, "
          "cache off, OTLP/HTTP to a discarding sink, slow rule off"
          + (f", base = {args.base_commit}" if args.base_commit else ""))
    header = ("preset", "mix", "tracing", "closed_rps", "vs_off", "closed_p99", "open_rps", "open_p99",
              "cpu/req", "cpu_vs_off", "errors")
    print(fixed_width(header[:-1], 12), f"{header[-1]:>7}")
    with base_source(args.base_commit) as base_dir:
        for name in args.presets:
            plan = PLANS[name] if args.seconds is None else dataclasses.replace(PLANS[name], seconds=args.seconds)
            print_preset(name, plan, measure_preset(plan, args.rounds, configs, base_dir, restart_every), configs)


def servers_said(restart_every: int | None) -> str:
    if restart_every is None:
        return "one server each"
    return "a fresh server per run" if restart_every == 1 else f"fresh servers every {restart_every} rounds"


def print_preset(name: str, plan: PresetPlan, summary: dict[str, dict[str, float]], configs: Sequence[str]) -> None:
    """One line per configuration; then each one's mean ratio to off with its interval, its rounds, the sink."""
    for config in configs:
        row = summary[config]
        values = (name, plan.mix, config, f"{row['rps']:.1f}", f"{row['vs_off']:.3f}",
                  f"{row['closed_p99_ms']:.1f} ms", f"{plan.open_rate_rps:.0f}", f"{row['open_p99_ms']:.1f} ms",
                  f"{row['cpu_ms']:.2f} ms", f"{row['cpu_vs_off']:.3f}")
        behind = " (generator behind)" if row["behind"] else ""
        print(fixed_width(values, 12), f"{int(row['errors']):>7}{behind}", flush=True)
    for config in configs:
        row = summary[config]
        mean, low, high = row["vs_off_interval"]  # type: ignore[misc]
        rounds = "/".join(f"{rps:.0f}" if rps >= 100 else f"{rps:.1f}" for rps in row["rounds_rps"])
        cpu_rounds = "/".join(f"{ms:.2f}" for ms in row["rounds_cpu_ms"])
        if config != "off":
            interval = (f"95 % interval {low:.3f}-{high:.3f}" if row["num_server_sets"] > 1
                        else "no interval from one set: --restart-every")
            print(f"{'':>12} {config}: throughput vs off, mean over {int(row['num_server_sets'])} sets of servers "
                  f"{mean:.3f} ({interval})")
        print(f"{'':>12} {config}: req/s per round {rounds}")
        print(f"{'':>12} {config}: CPU ms/req per round {cpu_rounds}", flush=True)
    sink = summary["sink"]
    print(f"{'':>12} sink received {int(sink['requests'])} OTLP export requests, "
          f"{sink['bytes'] / 1e6:.1f} MB, from the traced servers", flush=True)


if __name__ == "__main__":
    main()
