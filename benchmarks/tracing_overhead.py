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
import asyncio
import dataclasses
import platform
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import httpx
import torch

from benchmarks.loadgen.bench import run_bench
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.image_pool import ImageSize
from benchmarks.loadgen.workload import TextLengthRange, parse_mix
from benchmarks.serving_processes import ServerProcess, free_port, mmserve_command
from models.loading.repository import build_preset

TRACED_CONFIGS = ("off", "1%", "100%")
SAMPLE_RATIOS = {"0%": "0", "1%": "0.01", "100%": "1"}
NO_CACHE = {"CACHE_IMAGE_BYTES": "0", "CACHE_TEXT_BYTES": "0"}
TEXT_CHARS = TextLengthRange(16, 48)


@dataclass(frozen=True)
class PresetPlan:
    """One preset's load: the mix, the closed loop's clients, the open loop's rate, each phase's length."""

    preset: str
    mix: str
    concurrency: int
    open_rate_rps: float
    seconds: float


PLANS = {
    # Every stage and every span (decode, queue, vision, text, fusion, respond, the batch) per request.
    "tiny": PresetPlan("tiny", "fusion:1", concurrency=32, open_rate_rps=250.0, seconds=8.0),
    # Texts: a vit-b16 image batch takes seconds on this CPU, next to which any per-request cost
    # vanishes; the text tower is where vit-b16 serves hundreds of requests a second.
    "vit-b16": PresetPlan("vit-b16", "text:1", concurrency=32, open_rate_rps=40.0, seconds=10.0),
}


@contextmanager
def otlp_sink() -> Iterator[str]:
    """The discarding receiver as its own process; yields its base URL."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "benchmarks.otlp_sink", "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url + "/stats", timeout=1.0, trust_env=False)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def sink_stats(url: str) -> dict[str, int]:
    return httpx.get(url + "/stats", timeout=5.0, trust_env=False).json()


@contextmanager
def base_source(commit: str | None) -> Iterator[str | None]:
    """The repository at ``commit`` in a temporary directory (for PYTHONPATH), or ``None`` without one."""
    if commit is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="mmserve-base-") as directory:
        archive = subprocess.run(["git", "archive", commit], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
        yield directory


def server_settings(config: str, sink_url: str, base_dir: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """(MMSERVE_* settings without the prefix, extra environment) of one configuration."""
    if config == "base":
        assert base_dir is not None
        return dict(NO_CACHE), {"PYTHONPATH": os.pathsep.join([base_dir, os.environ.get("PYTHONPATH", "")])}
    if config == "off":
        return dict(NO_CACHE), {}
    ratio = SAMPLE_RATIOS[config]
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": sink_url + "/v1/traces", "OTEL_SERVICE_NAME": "mmserve-bench"}
    return {**NO_CACHE, "TRACE_SAMPLE_RATIO": ratio, "TRACE_SLOW_MS": "0"}, env


def bench_config(url: str, plan: PresetPlan, image_px: int, mode: RunMode, seed: int) -> BenchConfig:
    return BenchConfig(url=url, mode=mode, duration_s=plan.seconds,
                       rate_rps=plan.open_rate_rps if mode is RunMode.OPEN else None,
                       concurrency=plan.concurrency if mode is RunMode.CLOSED else None,
                       mix=parse_mix(plan.mix), num_images=64, image_size=ImageSize(image_px, image_px),
                       text_length=TEXT_CHARS, seed=seed, timeout_s=120.0, show_progress=False)


def measure_once(server: ServerProcess, plan: PresetPlan, image_px: int, seed: int) -> dict[str, float]:
    """One closed loop then one open loop; also the server's CPU time per answered request in the closed loop.

    CPU per request (from ``/proc``) is each request's work, whatever share
    of the two cores the server got beside the load generator.
    """
    server.resume()
    try:
        cpu_before_s = server.cpu_s()
        closed = asyncio.run(run_bench(bench_config(server.url, plan, image_px, RunMode.CLOSED, seed))).report
        closed_cpu_s = server.cpu_s() - cpu_before_s
        opened = asyncio.run(run_bench(bench_config(server.url, plan, image_px, RunMode.OPEN, seed))).report
    finally:
        server.pause()
    return {"rps": closed["throughput_rps"], "closed_p99_ms": closed["p99_ms"], "open_p99_ms": opened["p99_ms"],
            "cpu_ms": 1000.0 * closed_cpu_s / max(closed["ok"], 1),
            "errors": closed["errors"] + opened["errors"], "behind": float(bool(opened.get("generator_bottleneck")))}


def start_server(config: str, plan: PresetPlan, sink_url: str, base_dir: str | None) -> ServerProcess:
    settings, env = server_settings(config, sink_url, base_dir)
    command = mmserve_command(plan.preset, settings)
    server = ServerProcess(dataclasses.replace(command, env={**command.env, **env}))
    try:
        server.wait_ready(600.0)
    except BaseException:
        server.stop()
        raise
    server.pause()
    return server


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
            with ExitStack() as stack:
                servers: dict[str, ServerProcess] = {}
                for config in configs:
                    servers[config] = start_server(config, plan, sink_url, base_dir)
                    stack.callback(servers[config].stop)
                for round_index in range(first_round, min(first_round + rounds_per_set, num_rounds)):
                    shift = round_index % len(configs)
                    for config in tuple(configs[shift:]) + tuple(configs[:shift]):
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


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its 95 % confidence interval (Student's t), values taken as independent.

    The values are each set of servers' mean ratio. Sets run back to back on
    the same machine, so they are not quite independent; the interval is a
    guide to how many sets a claim needs, not a test.
    """
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half_width = T_975[min(len(values) - 1, len(T_975)) - 1] * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half_width, mean + half_width


# Student's t, two-sided 95 %, for 1..30 degrees of freedom (the last stands for more).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


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
    print(f"tracing overhead, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()} "
          f"x{torch.get_num_threads()} torch threads, torch {torch.__version__}, python {platform.python_version()}, "
          f"{args.rounds} rounds (order rotated), {servers_said(restart_every)}, "
          "cache off, OTLP/HTTP to a discarding sink, slow rule off"
          + (f", base = {args.base_commit}" if args.base_commit else ""))
    header = ("preset", "mix", "tracing", "closed_rps", "vs_off", "closed_p99", "open_rps", "open_p99",
              "cpu/req", "cpu_vs_off", "errors")
    print(" ".join(f"{h:>12}" for h in header[:-1]), f"{header[-1]:>7}")
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
        print(" ".join(f"{v:>12}" for v in values), f"{int(row['errors']):>7}{behind}", flush=True)
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
