"""mmserve against LitServe: same model, same inputs, same generator, one run.

LitServe serves the same preset with the same seeded weights, preprocessing,
batch cap and batch delay (``benchmarks.peer_litserve_app``), one inference
worker, with its ZeroMQ transport on (``fast_queue``, which its documentation
recommends above 100 requests/s and which served the tiny preset faster
here); mmserve runs as
``mmserve serve`` with its segment cache off, so both compute every request.
Both run the encoders as TorchScript graphs (mmserve's default; the LitServe
app traces them in ``setup``), so the two servers run the same compute path
and the comparison is of the serving around it. ``--litserve-eager`` gives
LitServe the eager modules instead, as its documentation writes a model.
Both servers run at once, each in its own process group, and the one not
being measured is paused (SIGSTOP): an idle LitServe polls its queue every
millisecond and would otherwise take CPU from mmserve's runs.

The machine's speed drifts by up to 20 % within minutes, so runs alternate in
an A-B-B-A pattern (one pair per round, the order mirrored), each server's
runs are pooled, and the result is the ratio. Each run also records how many
CPUs processes other than the two servers and this generator took meanwhile
(``/proc/stat``, steal included), so a run slowed by a neighbour shows as
such. Per preset:

1. saturation: a closed loop of C workers sending back to back (C well above
   the batch cap, so batches stay full); ok answers per second.
2. fixed rate: an open loop (Poisson arrivals) at 70 % of LitServe's measured
   saturation, latency from each request's intended send time (no
   coordinated omission); p50 and p99 over the pooled samples.

Then one batch with a bad item: 8 concurrent fusion requests, one of them a
truncated JPEG, sent over warm connections against servers started with a
long batch delay so all 8 land in one batch; every request's status code is
printed, with the batch sizes each server reports.

The workload is the generator's default (mix text:0.2,vision:0.3,fusion:0.5,
100 distinct 224x224 JPEGs, uniform popularity) except for text length:
16-60 characters, which fits every preset's token limit (the tiny preset
takes 64 tokens), so no request is refused or truncated.

    python -m benchmarks.peer_litserve --presets tiny vit-b16
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
import torch

from benchmarks.loadgen.bench import BenchOutcome, run_bench
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.image_pool import ImageFormat, ImagePool, ImageSize
from benchmarks.loadgen.runner import INFER_PATH, Sample
from benchmarks.loadgen.server_metrics import batch_size_view, scrape
from benchmarks.loadgen.stats import summarize_latency
from benchmarks.loadgen.workload import TextLengthRange
from benchmarks.serving_processes import ServerCommand, ServerProcess, litserve_command, mmserve_command, running

BATCH_CAP = 8
QUEUE_DELAY_MS = 5.0
PROBE_QUEUE_DELAY_MS = 250.0
PROBE_SIZE = 8
PROBE_BAD_INDEX = 3
FIXED_RATE_SHARE = 0.7
CACHE_OFF = {"CACHE_IMAGE_BYTES": "0", "CACHE_TEXT_BYTES": "0"}
LITSERVE = "litserve"
MMSERVE = "mmserve"


@dataclass(frozen=True)
class PresetPlan:
    """How long and how hard to drive one preset, and the targets mmserve should meet."""

    preset: str
    seconds: float
    num_rounds: int  # each round runs both servers once; an even number mirrors the order (A-B-B-A)
    warmup_s: float
    concurrency: int
    min_throughput_ratio: float
    max_p99_ratio: float


# Texts fit every preset's token limit (the tiny preset takes 64 tokens), so no request needs truncating.
TEXT_CHARS = TextLengthRange(16, 60)
PLANS = {
    "tiny": PresetPlan("tiny", seconds=10.0, num_rounds=4, warmup_s=3.0, concurrency=32,
                       min_throughput_ratio=1.15, max_p99_ratio=0.5),
    "vit-b16": PresetPlan("vit-b16", seconds=25.0, num_rounds=2, warmup_s=6.0, concurrency=16,
                          min_throughput_ratio=1.0, max_p99_ratio=0.7),
}


@dataclass
class ServerRuns:
    """Every measured run of one server for one preset."""

    throughputs_rps: list[float] = field(default_factory=list)
    saturation_other_cpus: list[float] = field(default_factory=list)
    open_samples: list[Sample] = field(default_factory=list)
    open_num_sent: int = 0
    open_num_ok: int = 0
    open_lag_p99_ms: list[float] = field(default_factory=list)
    other_cpus: list[float] = field(default_factory=list)

    @property
    def throughput_rps(self) -> float:
        return statistics.fmean(self.throughputs_rps)

    def throughput_per_free_cpu_rps(self, num_cpus: int) -> float:
        """Saturation ok/s per CPU that other processes left free, run by run, averaged.

        A first-order correction for a neighbour's load; it assumes throughput
        scales with the CPUs left, which holds best for a compute-bound model.
        """
        return statistics.fmean(
            rps / max(num_cpus - other, 0.1) for rps, other in zip(self.throughputs_rps, self.saturation_other_cpus)
        )

    def open_percentile_ms(self, key: str) -> float:
        summary = summarize_latency([sample.latency_s for sample in self.open_samples])
        value = dict(summary.percentiles_ms)[key]
        assert value is not None, "an open-loop run sent nothing"
        return value


def _config(url: str, mode: RunMode, seconds: float, seed: int, *, concurrency: int | None = None,
            rate_rps: float | None = None) -> BenchConfig:
    return BenchConfig(url=url, mode=mode, duration_s=seconds, concurrency=concurrency, rate_rps=rate_rps,
                       text_length=TEXT_CHARS, seed=seed, timeout_s=60.0, show_progress=False)


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (steal included: CPU another guest took)."""
    with open("/proc/stat", encoding="ascii") as stat:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in stat.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Measured:
    outcome: BenchOutcome
    other_cpus: float  # CPUs busy with neither server nor this generator, on average over the run


def _measured(server: ServerProcess, servers: Sequence[ServerProcess], config: BenchConfig) -> Measured:
    """One run against ``server``, resumed for the run and paused again after it.

    Also measures how much CPU everything else on the machine took meanwhile,
    so a run slowed by a neighbour shows as such.
    """
    server.resume()
    try:
        started_s = time.perf_counter()
        busy_before_s = machine_busy_s()
        ours_before_s = time.process_time() + sum(s.cpu_s() for s in servers)
        outcome = asyncio.run(run_bench(config))
        ours_s = time.process_time() + sum(s.cpu_s() for s in servers) - ours_before_s
        other_s = machine_busy_s() - busy_before_s - ours_s
        return Measured(outcome, max(0.0, other_s) / (time.perf_counter() - started_s))
    finally:
        server.pause()


def _abba(round_index: int) -> tuple[str, str]:
    return (LITSERVE, MMSERVE) if round_index % 2 == 0 else (MMSERVE, LITSERVE)


def _batch_means(report: dict) -> str:
    """mmserve's mean batch size per lane during the run (from /metrics; LitServe exports none)."""
    batch_size = report["server"].get("batch_size") or {}
    means = [f"{lane} {entry['mean']:.1f}" for lane, entry in sorted(batch_size.items()) if entry["mean"]]
    return f"; mean batch: {', '.join(means)}" if means else ""


def _log(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", flush=True)


def measure_preset(plan: PresetPlan, device: str, is_traced: bool) -> dict[str, ServerRuns]:
    """Saturation, then the fixed open-loop rate, alternating the two servers A-B-B-A."""
    settings = {**CACHE_OFF, "MAX_BATCH_SIZE": str(BATCH_CAP), "MAX_QUEUE_DELAY_MS": str(QUEUE_DELAY_MS)}
    commands = {
        MMSERVE: mmserve_command(plan.preset, settings, device=device),
        LITSERVE: litserve_command(plan.preset, max_batch_size=BATCH_CAP, max_queue_delay_ms=QUEUE_DELAY_MS,
                                   device=device, is_fast_queue=True, is_traced=is_traced),
    }
    runs = {LITSERVE: ServerRuns(), MMSERVE: ServerRuns()}
    # Started one after the other so neither start-up competes with the other's.
    with running(commands[MMSERVE]) as mmserve:
        mmserve.pause()
        with running(commands[LITSERVE]) as litserve:
            litserve.pause()
            servers = {LITSERVE: litserve, MMSERVE: mmserve}
            both = (litserve, mmserve)
            for name in (LITSERVE, MMSERVE):
                _measured(servers[name], both, _config(servers[name].url, RunMode.CLOSED, plan.warmup_s, 99,
                                                       concurrency=plan.concurrency))
            for round_index in range(plan.num_rounds):
                for name in _abba(round_index):
                    measured = _measured(servers[name], both, _config(servers[name].url, RunMode.CLOSED,
                                                                      plan.seconds, round_index,
                                                                      concurrency=plan.concurrency))
                    report = measured.outcome.report
                    runs[name].throughputs_rps.append(report["throughput_rps"])
                    runs[name].saturation_other_cpus.append(measured.other_cpus)
                    runs[name].other_cpus.append(measured.other_cpus)
                    _log(f"{plan.preset} saturation {name:8s} round {round_index}: "
                         f"{report['throughput_rps']:.1f} ok/s, errors {report['errors_by_status'] or '-'}; "
                         f"other processes took {measured.other_cpus:.2f} CPUs{_batch_means(report)}")
            rate_rps = FIXED_RATE_SHARE * runs[LITSERVE].throughput_rps
            for round_index in range(plan.num_rounds):
                for name in reversed(_abba(round_index)):
                    measured = _measured(servers[name], both, _config(servers[name].url, RunMode.OPEN,
                                                                      plan.seconds, 100 + round_index,
                                                                      rate_rps=rate_rps))
                    outcome = measured.outcome
                    report = outcome.report
                    runs[name].other_cpus.append(measured.other_cpus)
                    runs[name].open_samples.extend(outcome.result.samples)
                    runs[name].open_num_sent += report["sent"]
                    runs[name].open_num_ok += report["ok"]
                    if report["generator_lag_ms"]["p99"] is not None:
                        runs[name].open_lag_p99_ms.append(report["generator_lag_ms"]["p99"])
                    _log(f"{plan.preset} open {rate_rps:.1f} req/s {name:8s} round {round_index}: "
                         f"p50 {report['p50_ms']:.1f} ms, p99 {report['p99_ms']:.1f} ms, "
                         f"errors {report['errors_by_status'] or '-'}; "
                         f"other processes took {measured.other_cpus:.2f} CPUs")
    return runs


def _verdict(is_met: bool) -> str:
    return "met" if is_met else "NOT met"


def _worst_ms(values_ms: list[float]) -> str:
    return f"{max(values_ms):.1f}" if values_ms else "-"


def format_preset_table(plan: PresetPlan, runs: dict[str, ServerRuns]) -> str:
    lit, mm = runs[LITSERVE], runs[MMSERVE]
    rate_rps = FIXED_RATE_SHARE * lit.throughput_rps
    throughput_ratio = mm.throughput_rps / lit.throughput_rps
    num_cpus = len(os.sched_getaffinity(0))
    lit_per_cpu, mm_per_cpu = lit.throughput_per_free_cpu_rps(num_cpus), mm.throughput_per_free_cpu_rps(num_cpus)
    p50_ratio = mm.open_percentile_ms("p50_ms") / lit.open_percentile_ms("p50_ms")
    p99_ratio = mm.open_percentile_ms("p99_ms") / lit.open_percentile_ms("p99_ms")
    rows = [
        ("metric", "litserve", "mmserve", "mm/lit", "target", "verdict"),
        (f"saturation ok/s (closed loop, C={plan.concurrency})", f"{lit.throughput_rps:.1f}",
         f"{mm.throughput_rps:.1f}", f"{throughput_ratio:.2f}", f">= {plan.min_throughput_ratio:.2f}",
         _verdict(throughput_ratio >= plan.min_throughput_ratio)),
        ("  same, per CPU other processes left free", f"{lit_per_cpu:.2f}", f"{mm_per_cpu:.2f}",
         f"{mm_per_cpu / lit_per_cpu:.2f}", "-", "-"),
        (f"p50 ms at {rate_rps:.1f} req/s (open loop)", f"{lit.open_percentile_ms('p50_ms'):.1f}",
         f"{mm.open_percentile_ms('p50_ms'):.1f}", f"{p50_ratio:.2f}", "-", "-"),
        (f"p99 ms at {rate_rps:.1f} req/s (open loop)", f"{lit.open_percentile_ms('p99_ms'):.1f}",
         f"{mm.open_percentile_ms('p99_ms'):.1f}", f"{p99_ratio:.2f}", f"<= {plan.max_p99_ratio:.2f}",
         _verdict(p99_ratio <= plan.max_p99_ratio)),
        ("ok / sent at the fixed rate", f"{lit.open_num_ok}/{lit.open_num_sent}",
         f"{mm.open_num_ok}/{mm.open_num_sent}", "-", "-", "-"),
        ("generator p99 lag ms at the fixed rate (worst run)", _worst_ms(lit.open_lag_p99_ms),
         _worst_ms(mm.open_lag_p99_ms), "-", "-", "-"),
        ("CPUs other processes took during the runs (mean)", f"{statistics.fmean(lit.other_cpus):.2f}",
         f"{statistics.fmean(mm.other_cpus):.2f}", "-", "-", "-"),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    saturation_order = [name for index in range(plan.num_rounds) for name in _abba(index)]
    open_order = [name for index in range(plan.num_rounds) for name in reversed(_abba(index))]
    lines = [f"preset {plan.preset}: {plan.seconds:g} s per run; saturation runs {', '.join(saturation_order)}; "
             f"fixed-rate runs {', '.join(open_order)} (each server's runs pooled)"]
    lines += ["  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
              for row in rows]
    lines.append("(generator lag: how late requests left against their Poisson schedule; the generator shares "
                 "the CPUs with the server, and above 20 ms it was itself short of CPU)")
    return "\n".join(lines)


# -- one batch with a bad item ---------------------------------------------------------


@dataclass(frozen=True)
class ProbeResult:
    statuses: tuple[int, ...]
    batch_sizes: str


def probe_bodies(num_items: int, bad_index: int) -> list[bytes]:
    """Fusion requests over distinct images; item ``bad_index`` carries the first half of its JPEG."""
    pool = ImagePool(7, ImageSize(224, 224), ImageFormat.JPEG)
    pool.prepare(range(num_items))
    bodies = []
    for index in range(num_items):
        b64 = pool.b64(index)
        if index == bad_index:
            data = base64.b64decode(b64)
            b64 = base64.b64encode(data[: len(data) // 2])
        bodies.append(b'{"image":{"b64":"' + b64 + b'"},"text":"probe item ' + str(index).encode() + b'"}')
    return bodies


async def _send_together(url: str, ready_path: str, bodies: Sequence[bytes]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0, trust_env=False) as client:
        # Open every connection first, so the requests leave together rather than one handshake apart.
        await asyncio.gather(*(client.get(ready_path) for _ in bodies))
        headers = {"content-type": "application/json"}
        return list(await asyncio.gather(*(client.post(INFER_PATH, content=body, headers=headers)
                                           for body in bodies)))


async def _mmserve_batches(url: str, bodies: Sequence[bytes]) -> ProbeResult:
    async with httpx.AsyncClient(base_url=url, timeout=10.0, trust_env=False) as client:
        before = await scrape(client, 10.0)
        responses = await _send_together(url, "/health/live", bodies)
        after = await scrape(client, 10.0)
    view = None
    if before.snapshot is not None and after.snapshot is not None:
        view = batch_size_view(before.snapshot, after.snapshot)
    parts = []
    for lane, entry in sorted((view or {}).items()):
        if entry["num_batches"]:
            parts.append(f"{lane} lane ran {int(entry['num_batches'])} batch(es) holding "
                         f"{int(entry['num_requests'])} request(s)")
    return ProbeResult(tuple(r.status_code for r in responses), "; ".join(parts) or "no batch recorded")


async def _litserve_batches(url: str, bodies: Sequence[bytes]) -> ProbeResult:
    responses = await _send_together(url, "/health", bodies)
    sizes = sorted({r.json()["batch_size"] for r in responses if r.status_code == 200})
    failed = [i for i, r in enumerate(responses) if r.status_code != 200]
    text = f"answered items report batch sizes {sizes}" if sizes else "no item was answered"
    if failed:
        text += f"; items {failed} failed"
    return ProbeResult(tuple(r.status_code for r in responses), text)


def run_bad_item_probe(device: str, is_traced: bool) -> str:
    bodies = probe_bodies(PROBE_SIZE, PROBE_BAD_INDEX)
    settings = {**CACHE_OFF, "MAX_BATCH_SIZE": str(PROBE_SIZE), "MAX_QUEUE_DELAY_MS": str(PROBE_QUEUE_DELAY_MS)}
    results: dict[str, ProbeResult] = {}
    commands: dict[str, ServerCommand] = {
        MMSERVE: mmserve_command("tiny", settings, device=device),
        LITSERVE: litserve_command("tiny", max_batch_size=PROBE_SIZE, max_queue_delay_ms=PROBE_QUEUE_DELAY_MS,
                                   device=device, is_fast_queue=True, is_traced=is_traced),
    }
    with running(commands[MMSERVE]) as server:
        results[MMSERVE] = asyncio.run(_mmserve_batches(server.url, bodies))
    with running(commands[LITSERVE]) as server:
        results[LITSERVE] = asyncio.run(_litserve_batches(server.url, bodies))
    lines = [f"one batch with a bad item: {PROBE_SIZE} concurrent fusion requests (tiny preset), item "
             f"{PROBE_BAD_INDEX} a JPEG cut in half; batch cap {PROBE_SIZE}, batch delay {PROBE_QUEUE_DELAY_MS:g} ms"]
    for name in (LITSERVE, MMSERVE):
        result = results[name]
        others = [status for i, status in enumerate(result.statuses) if i != PROBE_BAD_INDEX]
        lines.append(f"  {name:8s} statuses {list(result.statuses)}  bad item {result.statuses[PROBE_BAD_INDEX]}, "
                     f"other {len(others)}: {sum(s == 200 for s in others)} x 200  ({result.batch_sizes})")
    return "\n".join(lines)


# -- the run -------------------------------------------------------------------------


def machine_line() -> str:
    model = "unknown CPU"
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    for line in lscpu.splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
    num_cpus = len(os.sched_getaffinity(0))
    return (f"{platform.machine()} {model}, {num_cpus} CPUs, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads in this process), python {platform.python_version()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny", "vit-b16"], choices=sorted(PLANS))
    parser.add_argument("--rounds", type=int, help="rounds per measurement (one run per server each), "
                        "overriding each preset's plan")
    parser.add_argument("--seconds", type=float, help="seconds per run, overriding each preset's plan")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--no-probe", action="store_true", help="skip the bad-item batch")
    parser.add_argument("--litserve-eager", action="store_true",
                        help="LitServe runs the eager encoders (default: TorchScript graphs, as mmserve)")
    args = parser.parse_args(argv)

    print(f"mmserve vs LitServe, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {machine_line()}")
    print(f"device {args.device}, float32, batch cap {BATCH_CAP}, batch delay {QUEUE_DELAY_MS:g} ms on both; "
          "mmserve segment cache off; LitServe 1 worker with fast_queue; encoders "
          f"{'eager on LitServe, TorchScript on mmserve' if args.litserve_eager else 'as TorchScript graphs on both'}; "
          "the idle server is paused during the "
          "other's runs; workload: generator defaults (mix text:0.2,vision:0.3,fusion:0.5, 100 JPEGs 224x224) "
          "with texts of 16-60 chars", flush=True)
    tables = []
    for name in args.presets:
        plan = PLANS[name]
        if args.seconds is not None:
            plan = dataclasses.replace(plan, seconds=args.seconds)
        if args.rounds is not None:
            plan = dataclasses.replace(plan, num_rounds=args.rounds)
        runs = measure_preset(plan, args.device, is_traced=not args.litserve_eager)
        tables.append(format_preset_table(plan, runs))
        print(tables[-1], flush=True)
    if not args.no_probe:
        tables.append(run_bad_item_probe(args.device, is_traced=not args.litserve_eager))
        print(tables[-1], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
