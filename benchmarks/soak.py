"""Soak: minutes of steady mixed load; does the server leak memory or file descriptors?

    python benchmarks/soak.py [--minutes 10] [--rate 0 (= half of the measured capacity)] [--preset tiny]

Starts ``mmserve serve`` in its own process, measures its capacity with a short
closed-loop run, then offers an open-loop Poisson load of text, image and fused
requests (images repeat, so the segment cache fills, evicts and is read) for
``--minutes``. Every few seconds it reads the server's RSS (``VmRSS`` in
``/proc/<pid>/status``) and its open file descriptors (``/proc/<pid>/fd``).
The table gives each resource's first, last, min and max sample and the
least-squares slope per minute over the run after the first minute (warm-up:
caches and allocator arenas filling). A leak shows as a slope that does not
vanish as the run gets longer.

Also provides what ``benchmarks/overload.py`` shares: the server process and
the /proc readings. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import numpy as np

from benchmarks.loadgen.bench import run_bench
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.image_pool import ImageSize
from benchmarks.loadgen.runner import Sample
from benchmarks.loadgen.workload import TextLengthRange, parse_mix

SAMPLE_INTERVAL_S = 5.0
WARM_UP_S = 60.0
READY_TIMEOUT_S = 600.0


# -- the server process and its resources ---------------------------------------------------------


@dataclass(frozen=True)
class ServedProcess:
    url: str
    pid: int


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def served(preset: str, settings: Mapping[str, str]) -> Iterator[ServedProcess]:
    """A ready ``mmserve serve --preset PRESET`` with ``MMSERVE_<name>`` settings; SIGTERM on the way out."""
    port = _free_port()
    env = {**os.environ, "MMSERVE_LOG_LEVEL": "warning",
           **{f"MMSERVE_{name.upper()}": value for name, value in settings.items()}}
    process = subprocess.Popen(
        [sys.executable, "-m", "server.cli", "serve", "--preset", preset, "--port", str(port), "--device", "cpu"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"mmserve exited during start-up: {process.stderr.read()[-3000:]}")
            try:
                if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("mmserve did not become ready")
            time.sleep(0.2)
        yield ServedProcess(url, process.pid)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS")


def num_open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class ResourceSampler:
    """Reads RSS and open fds of ``pid`` every ``interval_s`` on a thread, until stopped."""

    def __init__(self, pid: int, interval_s: float) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.times_s: list[float] = []
        self.rss_bytes: list[int] = []
        self.num_fds: list[int] = []
        self._started_s = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="resource-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            self.times_s.append(time.monotonic() - self._started_s)
            self.rss_bytes.append(rss_bytes(self.pid))
            self.num_fds.append(num_open_fds(self.pid))
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> ResourceSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def slope_per_minute(times_s: list[float], values: list[float]) -> float:
    """Least-squares slope of ``values`` against time, in units per minute."""
    if len(times_s) < 2:
        return float("nan")
    slope_per_s, _ = np.polyfit(np.asarray(times_s), np.asarray(values, dtype=np.float64), 1)
    return float(slope_per_s * 60.0)


# -- load -----------------------------------------------------------------------------------------------


MIX = "text:0.4,vision:0.3,fusion:0.3"


def bench_config(url: str, *, duration_s: float, rate_rps: float | None = None, concurrency: int | None = None,
                 seed: int = 0, num_images: int = 200, image_px: int = 256, mix: str = MIX,
                 timeout_s: float = 30.0) -> BenchConfig:
    """Square JPEGs and short texts in ``mix``; open loop at ``rate_rps``, or closed loop at ``concurrency``.

    Texts are cut to the model's limit (``truncate``) so that none is refused for its length.
    """
    return BenchConfig(url=url, mode=RunMode.OPEN if rate_rps is not None else RunMode.CLOSED,
                       duration_s=duration_s, rate_rps=rate_rps, concurrency=concurrency, mix=parse_mix(mix),
                       num_images=num_images, image_size=ImageSize(image_px, image_px), text_length=TextLengthRange(8, 60),
                       seed=seed, timeout_s=timeout_s, is_truncating=True, show_progress=False)


def run_load(config: BenchConfig) -> list[Sample]:
    return list(asyncio.run(run_bench(config)).result.samples)


def capacity_rps(url: str, duration_s: float = 8.0, concurrency: int = 32, image_px: int = 256,
                 mix: str = MIX) -> float:
    """Answers per second the server sustains with ``concurrency`` requests always outstanding."""
    samples = run_load(bench_config(url, duration_s=duration_s, concurrency=concurrency, seed=1,
                                    image_px=image_px, mix=mix))
    num_ok = sum(sample.is_ok for sample in samples)
    span_s = max(sample.done_s for sample in samples) - min(sample.intended_s for sample in samples)
    return num_ok / span_s


def latency_ms(samples: list[Sample], percentile: float, *, from_sent: bool = False) -> float:
    """A percentile of answered requests' latency: from the intended send time, or from the actual one.

    From the intended time (the open-loop default) includes the generator's
    own lag; from the actual send time is what the server itself took, the
    measure its deadlines are kept against.
    """
    latencies = [sample.done_s - sample.sent_s if from_sent else sample.latency_s
                 for sample in samples if sample.is_ok and (sample.sent_s is not None or not from_sent)]
    return float(np.percentile(latencies, percentile) * 1000) if latencies else float("nan")


def lag_p99_ms(samples: list[Sample]) -> float:
    """How far behind its schedule the generator sent (p99): above a few ms, the client limited the run."""
    lags = [sample.lag_s for sample in samples if sample.lag_s is not None]
    return float(np.percentile(lags, 99) * 1000) if lags else float("nan")


# -- the soak ---------------------------------------------------------------------------------------------


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def soak(preset: str, minutes: float, rate_rps: float, interval_s: float, is_cache_on: bool = True) -> str:
    cache_bytes = (8 * 1024**2, 2 * 1024**2) if is_cache_on else (0, 0)
    settings = {"cache_image_bytes": str(cache_bytes[0]), "cache_text_bytes": str(cache_bytes[1])}
    with served(preset, settings) as server:
        rate = rate_rps if rate_rps > 0 else 0.5 * capacity_rps(server.url)
        with ResourceSampler(server.pid, interval_s) as sampler:
            samples = run_load(bench_config(server.url, duration_s=minutes * 60, rate_rps=rate, seed=2))
    steady = [i for i, t in enumerate(sampler.times_s) if t >= min(WARM_UP_S, minutes * 60 / 2)]
    times = [sampler.times_s[i] for i in steady]
    rows = [("resource", "first", "last", "min", "max", "slope/min (after warm-up)")]
    for name, values, scale, unit in (("rss", sampler.rss_bytes, 1024**2, "MiB"), ("open fds", sampler.num_fds, 1, "")):
        scaled = [value / scale for value in values]
        slope = slope_per_minute(times, [scaled[i] for i in steady])
        rows.append((name, f"{scaled[0]:.1f}{unit}", f"{scaled[-1]:.1f}{unit}", f"{min(scaled):.1f}{unit}",
                     f"{max(scaled):.1f}{unit}", f"{slope:+.3f}{unit}"))
    statuses: dict[str, int] = {}
    for sample in samples:
        statuses[sample.outcome] = statuses.get(sample.outcome, 0) + 1
    summary = (f"soak: preset {preset}, {minutes:g} min, cache {'8 + 2 MiB' if is_cache_on else 'off'}, "
               f"open loop {rate:.1f} req/s ({MIX}); "
               f"{len(samples)} requests: {', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))}; "
               f"latency p50 {latency_ms(samples, 50):.1f} ms, p99 {latency_ms(samples, 99):.1f} ms; "
               f"{len(sampler.times_s)} samples every {interval_s:g} s")
    return summary + "\n" + _table(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=0.0, help="requests/s; 0: half of the measured capacity")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--interval-s", type=float, default=SAMPLE_INTERVAL_S)
    parser.add_argument("--cache-off", action="store_true",
                        help="turn the segment cache off, to tell a leak from caches filling")
    args = parser.parse_args(argv)
    print(soak(args.preset, args.minutes, args.rate, args.interval_s, is_cache_on=not args.cache_off))
    return 0


if __name__ == "__main__":
    sys.exit(main())
