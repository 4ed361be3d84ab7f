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

and each configuration's throughput relative to "off" in the same round
(median of the per-round ratios). Targets: off indistinguishable from the
build before tracing existed (base); 1 % costs <= 2 % throughput.

    python -m benchmarks.tracing_overhead --presets tiny vit-b16 --base-commit e4fa521
    python -m benchmarks.tracing_overhead --presets tiny --base-commit e4fa521 --fresh-servers --rounds 4
    python -m benchmarks.tracing_overhead --presets tiny --fresh-servers --configs off 0% 1%
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
from models.repository import build_preset

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


def _config(url: str, plan: PresetPlan, image_px: int, mode: RunMode, seed: int) -> BenchConfig:
    return BenchConfig(url=url, mode=mode, duration_s=plan.seconds,
                       rate_rps=plan.open_rate_rps if mode is RunMode.OPEN else None,
                       concurrency=plan.concurrency if mode is RunMode.CLOSED else None,
                       mix=parse_mix(plan.mix), num_images=64, image_size=ImageSize(image_px, image_px),
                       text_length=TEXT_CHARS, seed=seed, timeout_s=120.0, show_progress=False)


def measure_once(server: ServerProcess, plan: PresetPlan, image_px: int, seed: int) -> dict[str, float]:
    server.resume()
    try:
        closed = asyncio.run(run_bench(_config(server.url, plan, image_px, RunMode.CLOSED, seed))).report
        opened = asyncio.run(run_bench(_config(server.url, plan, image_px, RunMode.OPEN, seed))).report
    finally:
        server.pause()
    return {"rps": closed["throughput_rps"], "closed_p99_ms": closed["p99_ms"], "open_p99_ms": opened["p99_ms"],
            "errors": closed["errors"] + opened["errors"], "behind": float(bool(opened.get("generator_bottleneck")))}


def _start(config: str, plan: PresetPlan, sink_url: str, base_dir: str | None) -> ServerProcess:
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
                   base_dir: str | None, is_fresh_each_round: bool = False) -> dict[str, dict[str, float]]:
    """Every configuration once per round, in a rotated order.

    ``is_fresh_each_round``: start each configuration's server anew for every
    measurement, so a difference between two server processes (memory
    layout, what their warm-up left behind) falls on every configuration
    alike instead of sticking to one.
    """
    image_px = build_preset(plan.preset).config.preprocess.input_size
    rows: dict[str, list[dict[str, float]]] = {config: [] for config in configs}
    with otlp_sink() as sink_url, ExitStack() as stack:
        servers: dict[str, ServerProcess] = {}
        if not is_fresh_each_round:
            for config in configs:  # one at a time: warm-ups would compete for the cores
                servers[config] = _start(config, plan, sink_url, base_dir)
                stack.callback(servers[config].stop)
        exported_before = sink_stats(sink_url)
        for round_index in range(num_rounds):
            shift = round_index % len(configs)
            order = tuple(configs[shift:]) + tuple(configs[:shift])
            for config in order:
                server = servers[config] if not is_fresh_each_round else _start(config, plan, sink_url, base_dir)
                try:
                    rows[config].append(measure_once(server, plan, image_px, seed=round_index))
                finally:
                    if is_fresh_each_round:
                        server.stop()
        exported = sink_stats(sink_url)
    summary: dict[str, dict[str, float]] = {}
    for config in configs:
        runs = rows[config]
        summary[config] = {
            "rps": statistics.median(r["rps"] for r in runs),
            "closed_p99_ms": statistics.median(r["closed_p99_ms"] for r in runs),
            "open_p99_ms": statistics.median(r["open_p99_ms"] for r in runs),
            "vs_off": statistics.median(r["rps"] / off["rps"] for r, off in zip(runs, rows["off"])),
            "rounds_rps": [r["rps"] for r in runs],  # type: ignore[dict-item]
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
                        help="start every configuration's server anew for each measurement")
    parser.add_argument("--seconds", type=float, help="override each phase's duration")
    parser.add_argument("--base-commit", help="also serve this commit (the build before tracing) as 'base'")
    parser.add_argument("--configs", nargs="+", choices=["off", *SAMPLE_RATIOS], default=list(TRACED_CONFIGS),
                        help="the configurations besides 'base' ('off' is always measured: ratios are against it)")
    args = parser.parse_args()
    configs = (("base",) if args.base_commit else ()) + ("off",) + tuple(c for c in args.configs if c != "off")
    print(f"tracing overhead, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()} "
          f"x{torch.get_num_threads()} torch threads, torch {torch.__version__}, python {platform.python_version()}, "
          f"{args.rounds} rounds (order rotated), {'a fresh server per run' if args.fresh_servers else 'one server each'}, "
          "cache off, OTLP/HTTP to a discarding sink, slow rule off"
          + (f", base = {args.base_commit}" if args.base_commit else ""))
    header = ("preset", "mix", "tracing", "closed_rps", "vs_off", "closed_p99", "open_rps", "open_p99",
              "rps per round", "errors")
    print(" ".join(f"{h:>12}" for h in header[:-2]), f"{header[-2]:>26}", f"{header[-1]:>7}")
    with base_source(args.base_commit) as base_dir:
        for name in args.presets:
            plan = PLANS[name] if args.seconds is None else dataclasses.replace(PLANS[name], seconds=args.seconds)
            print_preset(name, plan, measure_preset(plan, args.rounds, configs, base_dir, args.fresh_servers), configs)


def print_preset(name: str, plan: PresetPlan, summary: dict[str, dict[str, float]], configs: Sequence[str]) -> None:
    """One line per configuration, then what the sink received."""
    for config in configs:
        row = summary[config]
        rounds = "/".join(f"{rps:.0f}" if rps >= 100 else f"{rps:.1f}" for rps in row["rounds_rps"])
        values = (name, plan.mix, config, f"{row['rps']:.1f}", f"{row['vs_off']:.3f}",
                  f"{row['closed_p99_ms']:.1f} ms", f"{plan.open_rate_rps:.0f}", f"{row['open_p99_ms']:.1f} ms")
        behind = " (generator behind)" if row["behind"] else ""
        print(" ".join(f"{v:>12}" for v in values), f"{rounds:>26}", f"{int(row['errors']):>7}{behind}", flush=True)
    sink = summary["sink"]
    print(f"{'':>12} sink received {int(sink['requests'])} OTLP export requests, "
          f"{sink['bytes'] / 1e6:.1f} MB, from the traced servers", flush=True)


if __name__ == "__main__":
    main()
