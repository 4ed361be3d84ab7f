"""The set-up both tracing benchmarks share: the presets' loads, each tracing configuration's server, the sink.

``benchmarks.tracing_overhead`` (throughput and CPU per request, alternated;
its docstring lists the configurations: base, off, 0%, 1%, 100%) and
``benchmarks.tracing_cpu_share`` (tracing's share of sampled stacks) measure
the same servers under the same load: segment cache off, slow-request rule
off, OTLP/HTTP export to the discarding sink (``benchmarks.otlp_sink``) in a
process of its own.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from benchmarks.harness import (
    ServerCommand, ServerProcess, mmserve_command, otlp_sink_command, running, start_paused,
)
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.image_pool import ImageSize
from benchmarks.loadgen.workload import TextLengthRange, parse_mix

TRACED_CONFIGS = ("off", "1%", "100%")
SAMPLE_RATIOS = {"0%": "0", "1%": "0.01", "100%": "1"}
NO_CACHE = {"CACHE_IMAGE_BYTES": "0", "CACHE_TEXT_BYTES": "0"}
TEXT_CHARS = TextLengthRange(16, 48)
SINK_READY_TIMEOUT_S = 30.0


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
    with running(otlp_sink_command(), SINK_READY_TIMEOUT_S) as sink:
        yield sink.url


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


def server_command(config: str, plan: PresetPlan, sink_url: str, base_dir: str | None) -> ServerCommand:
    """How to start ``config``'s server of ``plan``'s preset."""
    settings, env = server_settings(config, sink_url, base_dir)
    command = mmserve_command(plan.preset, settings)
    return dataclasses.replace(command, env={**command.env, **env})


def start_server(config: str, plan: PresetPlan, sink_url: str, base_dir: str | None) -> ServerProcess:
    """``config``'s server of ``plan``'s preset, ready and paused."""
    return start_paused(server_command(config, plan, sink_url, base_dir))
