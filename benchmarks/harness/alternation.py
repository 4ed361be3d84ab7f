"""Two servers measured in turn on one machine: A-B-B-A rounds, the idle one paused, the neighbours counted.

The machine's speed drifts by up to 20 % within minutes, so runs alternate
A-B-B-A, each server's runs are pooled and the result is a ratio; the server
not measured is paused (SIGSTOP). Per comparison: saturation (a closed loop
of ``plan.concurrency``, by the Python generator or ``saturate``, e.g. wrk),
then an open loop at a share of the *peer's* saturation, latency from each
request's intended send time. A ``ConfigFor`` turns a ``RunSpec`` into what
the generator sends.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

from benchmarks.harness.cpu_accounting import CpuMeter, CpuSpent, cpu_ms_per_request
from benchmarks.harness.server_process import ServerCommand, ServerProcess, paused_servers, resumed
from benchmarks.loadgen.bench import BenchOutcome, run_bench
from benchmarks.loadgen.config import BenchConfig, RunMode
from benchmarks.loadgen.runner import Sample
from benchmarks.loadgen.stats import summarize_latency

FIXED_RATE_SHARE = 0.7
WARMUP_SEED = 99
OPEN_SEED_BASE = 100
T = TypeVar("T")


def abba_order(round_index: int, first: str, second: str) -> tuple[str, str]:
    """Round 0 runs ``first`` then ``second``, round 1 the mirror, and so on."""
    return (first, second) if round_index % 2 == 0 else (second, first)


def abba_sequence(first: str, second: str, num_rounds: int) -> list[str]:
    """Every run of ``num_rounds`` A-B-B-A rounds in order: ``a, b, b, a, a, b, ...``."""
    return [name for index in range(num_rounds) for name in abba_order(index, first, second)]


def run_orders(num_rounds: int, peer: str, ours: str) -> tuple[list[str], list[str]]:
    """The order of the saturation runs and of the fixed-rate runs, as ``run_alternated`` makes them."""
    saturation = abba_sequence(peer, ours, num_rounds)
    fixed_rate = [name for index in range(num_rounds) for name in reversed(abba_order(index, peer, ours))]
    return saturation, fixed_rate


@dataclass(frozen=True)
class AlternationPlan:
    """How long and how hard to drive one comparison."""

    seconds: float
    num_rounds: int  # each round runs both servers once; an even number mirrors the order (A-B-B-A)
    warmup_s: float
    concurrency: int
    fixed_rate_share: float = FIXED_RATE_SHARE


@dataclass(frozen=True)
class RunSpec:
    """One run the alternation asks for: which server, where, closed or open loop, how long and how hard."""

    name: str
    url: str
    mode: RunMode
    seconds: float
    seed: int
    concurrency: int | None = None  # the closed loop's workers
    rate_rps: float | None = None  # the open loop's Poisson rate

    def config(self, **workload: Any) -> BenchConfig:
        """The generator's configuration for this run; ``workload`` says what is sent (mix, texts, images...)."""
        return BenchConfig(url=self.url, mode=self.mode, duration_s=self.seconds, concurrency=self.concurrency,
                           rate_rps=self.rate_rps, seed=self.seed, show_progress=False, **workload)


ConfigFor = Callable[[RunSpec], BenchConfig]


@dataclass
class ServerRuns:
    """Every measured run of one server for one comparison."""

    throughputs_rps: list[float] = field(default_factory=list)
    saturation_other_cpus: list[float] = field(default_factory=list)
    saturation_cpu_s: list[float] = field(default_factory=list)  # the server's CPU seconds, run by run
    saturation_num_ok: list[int] = field(default_factory=list)
    saturation_wall_s: list[float] = field(default_factory=list)
    open_samples: list[Sample] = field(default_factory=list)
    open_num_sent: int = 0
    open_num_ok: int = 0
    open_lag_p99_ms: list[float] = field(default_factory=list)
    other_cpus: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

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

    @property
    def has_cpu(self) -> bool:
        """Whether the saturation runs recorded the server's CPU (runs made up in a test may not)."""
        return bool(self.saturation_cpu_s)

    @property
    def cpu_ms_per_request(self) -> float:
        """The server's CPU per answered request at saturation, pooled: every run's CPU over every run's answers.

        Pooled rather than averaged run by run, so a short or slow run weighs what it answered.
        """
        return cpu_ms_per_request(sum(self.saturation_cpu_s), sum(self.saturation_num_ok))

    @property
    def server_cores(self) -> float:
        """CPUs the server kept busy at saturation: its CPU seconds over the runs' wall seconds."""
        wall_s = sum(self.saturation_wall_s)
        return sum(self.saturation_cpu_s) / wall_s if wall_s > 0 else 0.0

    def record_saturation(self, saturation: SaturationRun, cpu: CpuSpent) -> None:
        """One saturation run: its answers/s and the CPU the server and the other processes took meanwhile."""
        self.throughputs_rps.append(saturation.ok_rps)
        self.saturation_other_cpus.append(cpu.other_cpus)
        self.other_cpus.append(cpu.other_cpus)
        self.saturation_cpu_s.append(cpu.server_s)
        self.saturation_num_ok.append(saturation.num_ok)
        self.saturation_wall_s.append(cpu.wall_s)
        self.count_errors(saturation.errors_by_status)

    def open_percentile_ms(self, key: str) -> float:
        summary = summarize_latency([sample.latency_s for sample in self.open_samples])
        value = dict(summary.percentiles_ms)[key]
        assert value is not None, "an open-loop run sent nothing"
        return value

    def count_errors(self, errors_by_status: Mapping[str, int]) -> None:
        for status, count in errors_by_status.items():
            self.errors[status] = self.errors.get(status, 0) + count


@dataclass(frozen=True)
class SaturationRun:
    """What one closed-loop run answered, whichever generator drove it."""

    num_ok: int
    ok_rps: float
    errors_by_status: Mapping[str, int]
    detail: str = ""  # appended to the run's log line, e.g. mmserve's mean batch sizes


Saturate = Callable[[RunSpec], SaturationRun]


def measured(server: ServerProcess, servers: Sequence[ServerProcess], run: Callable[[], T]) -> tuple[T, CpuSpent]:
    """``run()`` against ``server``, resumed for it and paused again after it, with the CPU it and others took."""
    with resumed(server):
        meter = CpuMeter(server, servers)
        result = run()
        return result, meter.stop()


def python_saturation(config_for: ConfigFor) -> Saturate:
    """Saturation runs by this process's generator (``benchmarks.loadgen``), configured by ``config_for``."""

    def saturate(run: RunSpec) -> SaturationRun:
        report = asyncio.run(run_bench(config_for(run))).report
        return SaturationRun(report["ok"], report["throughput_rps"], report["errors_by_status"], batch_means(report))

    return saturate


def batch_means(report: dict) -> str:
    """mmserve's mean batch size per lane during the run (from /metrics; peers export none)."""
    return mean_batch_text(report["server"].get("batch_size"))


def mean_batch_text(batch_size: Mapping[str, Any] | None) -> str:
    """``; mean batch: text 5.7`` from ``benchmarks.loadgen.server_metrics.batch_size_view``; "" without one."""
    means = [f"{lane} {entry['mean']:.1f}" for lane, entry in sorted((batch_size or {}).items()) if entry["mean"]]
    return f"; mean batch: {', '.join(means)}" if means else ""


def log(message: str, *, file: TextIO | None = None) -> None:
    """A progress line, time-stamped, on stdout (or ``file``), apart from a benchmark's table."""
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=file, flush=True)


def saturation_order(names: Sequence[str], round_index: int) -> tuple[str, ...]:
    """Every server once per round, the order mirrored every other round (A-B-B-A for two)."""
    return tuple(names) if round_index % 2 == 0 else tuple(reversed(names))


def run_saturation(servers: Mapping[str, ServerProcess], names: Sequence[str], plan: AlternationPlan,
                   saturate: Saturate, label: str) -> dict[str, ServerRuns]:
    """One unmeasured warm-up per server, then ``plan.num_rounds`` rounds of saturation runs, mirrored.

    ``servers`` are started and paused; each is resumed only for its own runs.
    """
    runs = {name: ServerRuns() for name in names}
    every = tuple(servers.values())

    def run(name: str, seconds: float, seed: int) -> tuple[SaturationRun, CpuSpent]:
        spec = RunSpec(name, servers[name].url, RunMode.CLOSED, seconds, seed, concurrency=plan.concurrency)
        return measured(servers[name], every, lambda: saturate(spec))

    for name in names:
        run(name, plan.warmup_s, WARMUP_SEED)
    for round_index in range(plan.num_rounds):
        for name in saturation_order(names, round_index):
            saturation, cpu = run(name, plan.seconds, round_index)
            runs[name].record_saturation(saturation, cpu)
            log(f"{label} saturation {name:8s} round {round_index}: {saturation.ok_rps:.1f} ok/s, "
                f"{cpu.server_ms_per_request(saturation.num_ok):.2f} server CPU ms per answer, "
                f"errors {dict(saturation.errors_by_status) or '-'}; "
                f"other processes took {cpu.other_cpus:.2f} CPUs{saturation.detail}")
    return runs


def run_alternated(servers: Mapping[str, ServerProcess], peer: str, ours: str, plan: AlternationPlan,
                   config_for: ConfigFor, label: str, saturate: Saturate | None = None) -> dict[str, ServerRuns]:
    """Saturation, then the fixed open-loop rate (a share of ``peer``'s saturation), A-B-B-A.

    ``servers`` are started and paused; each is resumed only for its own runs.
    ``saturate`` drives the saturation runs (default: the Python generator
    with ``config_for``'s configuration); the fixed-rate runs always use
    ``config_for``.
    """
    runs = run_saturation(servers, (peer, ours), plan, saturate or python_saturation(config_for), label)
    both = tuple(servers.values())

    def run(name: str, seconds: float, seed: int, rate_rps: float) -> tuple[BenchOutcome, CpuSpent]:
        config = config_for(RunSpec(name, servers[name].url, RunMode.OPEN, seconds, seed, rate_rps=rate_rps))
        return measured(servers[name], both, lambda: asyncio.run(run_bench(config)))

    rate_rps = plan.fixed_rate_share * runs[peer].throughput_rps
    for round_index in range(plan.num_rounds):
        for name in reversed(abba_order(round_index, peer, ours)):
            outcome, cpu = run(name, plan.seconds, OPEN_SEED_BASE + round_index, rate_rps)
            report = outcome.report
            runs[name].other_cpus.append(cpu.other_cpus)
            runs[name].open_samples.extend(outcome.result.samples)
            runs[name].open_num_sent += report["sent"]
            runs[name].open_num_ok += report["ok"]
            runs[name].count_errors(report["errors_by_status"])
            if report["generator_lag_ms"]["p99"] is not None:
                runs[name].open_lag_p99_ms.append(report["generator_lag_ms"]["p99"])
            log(f"{label} open {rate_rps:.1f} req/s {name:8s} round {round_index}: "
                f"p50 {report['p50_ms']:.1f} ms, p99 {report['p99_ms']:.1f} ms, "
                f"errors {report['errors_by_status'] or '-'}; "
                f"other processes took {cpu.other_cpus:.2f} CPUs")
    return runs


def compare(commands: Mapping[str, ServerCommand], peer: str, ours: str, plan: AlternationPlan,
            config_for: ConfigFor, label: str, saturate: Saturate | None = None) -> dict[str, ServerRuns]:
    """Start both servers (in ``commands``' order, each paused once ready), then ``run_alternated``; stop them."""
    with paused_servers(commands) as servers:
        return run_alternated(servers, peer, ours, plan, config_for, label, saturate)
