"""Drift detection and ingest cost of ``monitoring.Monitor`` on a simulated clock.

Feeds the package directly (no server): synthetic per-stage latencies for the
``text``, ``vision`` and ``fusion`` routes go through ``Monitor.record`` (the
hot path) and ``Monitor.tick`` (the folder the background thread runs), one
simulated second at a time, on a ``ManualClock``. Default ``MonitorConfig``
(window 120 s, period 30 s, baseline 600 s, threshold 0.02, 3 periods).

Requests come in batches of 1 to 16, as the server runs them: the requests
of one batch share its compute times (``vision``, ``text``, ``fusion``; a
stall delays a whole batch), while decode, queue, respond and cache reads
are each request's own. Each detection scenario runs twice: with the noise
floor counted in batches (the rule) and counted in requests (the rule before
it, ``request_stages`` = every stage), which batch-shared times push over
its floor.

Scenarios:

  stationary   10 min baseline, then 60 min of the same traffic: count alarms.
  stall        after the baseline, 20 % of requests that run the vision
               encoder take 172 ms longer in ``vision``: periods to detection
               per route, and the stage named.
  creep        the vision stage's spread widens over 10 minutes (median fixed)
               until the vision route's end-to-end P99 is 10 % higher: when
               drift is raised, and how far P99 had crept by then.
  ingest       samples/s through record + fold at 10k requests/s over one drift
               period (folds, sub-window rotations, the drift judgement and
               scrapes included), per-request record cost, and where the time
               goes (record call, grouping, conversion, digests); plain, with
               batch size + cache outcome, and with those plus the request's
               inputs (counted per input value for attribution).

    python benchmarks/drift_detection.py [--minutes 60] [--seed 0] [--scenarios ingest ...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from fastdigest import TDigest

from monitoring import DriftState, ManualClock, Monitor, MonitorConfig, RequestInputs
from monitoring.ingest import fold_records

# Per route: requests per second.
RATES = {"text": 400, "vision": 150, "fusion": 150}
VISION_MEDIAN_S = 0.020
VISION_SIGMA = 0.2
FUSION_CACHE_HIT_RATIO = 0.6
BATCH_SIZES = np.array([1, 2, 4, 8, 16])

# (rng, n, vision_sigma, stall_fraction, stall_s) -> per-stage int64 ns, plus batch sizes and cache hits
RouteSampler = Callable[..., tuple[dict[str, np.ndarray], np.ndarray | None, np.ndarray | None]]


def _ln(rng: np.random.Generator, median_s: float, sigma: float, n: int) -> np.ndarray:
    return rng.lognormal(np.log(median_s * 1e9), sigma, n)


def _batches(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Each of ``n`` requests' batch size and batch index (consecutive requests share a batch), and the count."""
    sizes = rng.choice(BATCH_SIZES, n)  # at least n requests' worth; the last batch may be cut
    index = np.repeat(np.arange(n), sizes)[:n]
    num_batches = int(index[-1]) + 1
    return sizes[index], index, num_batches


def sample_route(
    route: str, rng: np.random.Generator, n: int, vision_sigma: float, stall_fraction: float, stall_s: float
) -> tuple[list[str], list[np.ndarray], np.ndarray | None, np.ndarray | None]:
    """Stage names, per-stage ns columns, batch sizes and cache hits for ``n`` requests of ``route``.

    Compute stages are drawn once per batch and shared by its requests.
    """
    stages: dict[str, np.ndarray] = {}
    hits = None
    batch, index, num_batches = _batches(rng, n)
    if route == "text":
        stages["decode"] = _ln(rng, 0.00005, 0.3, n)
        stages["queue"] = _ln(rng, 0.001, 0.6, n)
        stages["text"] = _ln(rng, 0.003, 0.25, num_batches)[index]
        stages["respond"] = _ln(rng, 0.0001, 0.3, n)
    else:
        stages["decode"] = _ln(rng, 0.002, 0.3, n)
        stages["queue"] = _ln(rng, 0.002, 0.6, n)
        vision = _ln(rng, VISION_MEDIAN_S, vision_sigma, num_batches)
        vision += (rng.random(num_batches) < stall_fraction) * stall_s * 1e9
        stages["vision"] = vision[index]
        if route == "fusion":
            hits = rng.random(n) < FUSION_CACHE_HIT_RATIO
            stages["vision"] = np.where(hits, _ln(rng, 0.0001, 0.3, n), stages["vision"])  # a hit is a cache read
            stages["text"] = _ln(rng, 0.003, 0.25, num_batches)[index]
            stages["fusion"] = _ln(rng, 0.0015, 0.2, num_batches)[index]
        stages["respond"] = _ln(rng, 0.0002, 0.3, n)
    stages["total"] = np.sum(list(stages.values()), axis=0)
    names = list(stages)
    return names, [stages[s].astype(np.int64) for s in names], batch, hits


@dataclass
class Simulation:
    """A monitor on a manual clock plus the traffic knobs scenarios turn."""

    monitor: Monitor
    clock: ManualClock
    rng: np.random.Generator
    vision_sigma: float = VISION_SIGMA
    stall_fraction: float = 0.0
    stall_s: float = 0.0
    periods: int = 0

    def run(self, seconds: int, on_period: Callable[[Simulation], None] | None = None,
            each_second: Callable[[Simulation, int], None] | None = None) -> None:
        record = self.monitor.record
        for second in range(seconds):
            if each_second is not None:
                each_second(self, second)
            for route, rate in RATES.items():
                names, columns, batch, hits = sample_route(
                    route, self.rng, rate, self.vision_sigma, self.stall_fraction, self.stall_s
                )
                batch_list = batch.tolist() if batch is not None else [None] * rate
                hit_list = hits.tolist() if hits is not None else [None] * rate
                for values, b, h in zip(zip(*[c.tolist() for c in columns]), batch_list, hit_list):
                    record(route, dict(zip(names, values)), batch_size=b, cache_hit=h)
            self.clock.advance(1.0)
            if self.monitor.tick():
                self.periods += 1
                if on_period is not None:
                    on_period(self)


ALL_STAGES = ("decode", "queue", "vision", "text", "fusion", "respond", "total")
FLOORS: dict[str, dict[str, object]] = {
    "batches": {},  # the rule: stages measured across a batch count batches
    "requests": {"request_stages": ALL_STAGES},  # every sample an observation, as before
}


def new_simulation(seed: int, floor: str = "batches") -> Simulation:
    clock = ManualClock()
    sim = Simulation(Monitor(MonitorConfig(**FLOORS[floor]), clock=clock), clock, np.random.default_rng(seed))
    sim.run(30)  # warm-up traffic before readiness, kept out of the baseline
    sim.monitor.mark_ready()
    sim.run(int(sim.monitor.config.baseline_s))
    assert sim.monitor.baseline_phase.value == "frozen"
    return sim


def scenario_stationary(seed: int, minutes: int, floor: str) -> list[tuple[str, str]]:
    sim = new_simulation(seed, floor)
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
    return [
        (f"stationary {minutes} min, 3 routes, floor in {floor}",
         f"false alarms: {len(set(alarms))} routes / {len(alarms)} periods drifting"),
        ("", f"periods judged: {judged} (route x period); single shifted periods: {shifted_periods}"),
        ("", f"max D(total): {ks_text}"),
        ("", f"max D(total) / its noise floor: {floor_text}"),
        ("", f"simulated {minutes * 60 + 630} s of traffic in {elapsed:.1f} s wall"),
    ]


def scenario_stall(seed: int, floor: str) -> list[tuple[str, str]]:
    sim = new_simulation(seed, floor)
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
            rows.append((f"  {route}", f"drift after {periods} periods ({periods * period_s:.0f} s), "
                                      f"stage={stage}, D(total)={ks:.3f}"))
        else:
            rows.append((f"  {route}", "no drift (route has no vision stage)" if route == "text" else "NOT detected"))
    status = sim.monitor.drift_status()["fusion"]
    separating = status.attribution.separating_segments if status.attribution else ()
    separated = ", ".join(f"{s.dimension}={s.value} (D {s.ks:.3f})" for s in separating)
    rows.append(("  fusion, separating segment", separated or "none"))
    return [(f"vision stall +172 ms on 20 % of batches, floor in {floor}", "")] + rows


def p99_total_vision(sigma: float, rng: np.random.Generator) -> float:
    names, columns, _, _ = sample_route("vision", rng, 400_000, sigma, 0.0, 0.0)
    return float(np.quantile(columns[names.index("total")], 0.99))


def calibrate_creep_sigma(seed: int) -> tuple[float, float]:
    """The vision-stage sigma that makes the vision route's end-to-end P99 10 % higher; and the base P99."""
    base = p99_total_vision(VISION_SIGMA, np.random.default_rng(seed))
    low, high = VISION_SIGMA, 1.0
    for _ in range(30):
        mid = (low + high) / 2
        if p99_total_vision(mid, np.random.default_rng(seed)) < 1.10 * base:
            low = mid
        else:
            high = mid
    return (low + high) / 2, base


def scenario_creep(seed: int, floor: str) -> list[tuple[str, str]]:
    target_sigma, base_p99_ns = calibrate_creep_sigma(seed)
    sim = new_simulation(seed, floor)
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
    rows = [(f"P99 creep +10 % over 10 min, floor in {floor}",
             f"vision sigma {VISION_SIGMA} -> {target_sigma:.3f}, median fixed; "
             f"base P99(total) {base_p99_ns / 1e6:.2f} ms")]
    for route in ("vision", "fusion"):
        if route not in detected:
            rows.append((f"  {route}", "NOT detected within 15 min"))
            continue
        at_s, stage, rule, sigma = detected[route]
        creep = p99_total_vision(sigma, np.random.default_rng(seed)) / base_p99_ns - 1
        note = " (P99 of the vision route)" if route == "fusion" else ""
        rows.append((f"  {route}", f"drift {at_s / 60:.1f} min after the creep began, "
                                   f"P99 then +{creep * 100:.1f} %{note}, rule={rule}, stage={stage}"))
    return rows


def _best_of(repeats: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(repeats))


INGEST_RATE = 10_000  # requests per simulated second; the folder folds once a second
INGEST_POOL = 100_000  # distinct requests, cycled
SCRAPE_EVERY_S = 15  # a Prometheus scrape interval


@dataclass
class IngestTimings:
    """Nanoseconds per request of one simulated drift period at ``INGEST_RATE``."""

    record_ns: float
    fold_ns: float  # every tick: drain, group, convert, digest updates, rotations, the drift judgement
    scrape_ns: float
    judgement_ms: float  # the judging tick minus another rotating one: the reads the drift judgement makes
    scrape_ms: float  # one scrape (export_snapshot)


def scenario_ingest(seed: int) -> list[tuple[str, str]]:
    """What the folder thread costs the server at 10k requests/s, per sample.

    A monitor with the server's configuration (``MonitorConfig()``) learns its
    baseline from a trickle of the same traffic, so that drift is judged;
    then one drift period of 10k requests per simulated second is recorded,
    folded every second (rotating a sub-window every 10 s), judged once, and
    scraped every 15 s, all timed.
    """
    rng = np.random.default_rng(seed)
    config = MonitorConfig()
    names, columns, batch, hits = sample_route("fusion", rng, INGEST_POOL, VISION_SIGMA, 0.0, 0.0)
    dicts = [dict(zip(names, values)) for values in zip(*[c.tolist() for c in columns])]
    batch_list, hit_list = batch.tolist(), hits.tolist()
    # What fusion requests carry: a few encodings and sizes, texts of several lengths.
    inputs_pool = [RequestInputs.of(largest_image_pixels=pixels, image_encoding=encoding, num_text_tokens=tokens,
                                    num_images=1, priority="normal", protocol="native")
                   for pixels in (200_000, 2_000_000) for encoding in ("jpeg", "png", "raw_uint8")
                   for tokens in (8, 40)]
    inputs_list = [inputs_pool[i] for i in rng.integers(0, len(inputs_pool), INGEST_POOL).tolist()]
    num_stages = len(names)
    period_s = int(config.period_s)
    num_requests = period_s * INGEST_RATE
    rows: list[tuple[str, str]] = []

    def record_only(with_segments: bool) -> float:
        monitor = Monitor(clock=ManualClock())
        record = monitor.record
        started = time.perf_counter_ns()
        if with_segments:
            for d, b, h in zip(dicts, batch_list, hit_list):
                record("fusion", d, batch_size=b, cache_hit=h)
        else:
            for d in dicts:
                record("fusion", d)
        return (time.perf_counter_ns() - started) / len(dicts)

    def frozen_monitor(with_segments: bool, with_inputs: bool) -> tuple[Monitor, ManualClock]:
        """A monitor whose baseline was learned from 100 requests/s, so this period is judged."""
        clock = ManualClock()
        monitor = Monitor(config, clock=clock)
        monitor.mark_ready()
        trickle = 100
        for second in range(int(config.baseline_s)):
            for i in range(second * trickle % INGEST_POOL, second * trickle % INGEST_POOL + trickle):
                monitor.record("fusion", dicts[i], batch_size=batch_list[i] if with_segments else None,
                               cache_hit=hit_list[i] if with_segments else None,
                               inputs=inputs_list[i] if with_inputs else None)
            clock.advance(1.0)
            monitor.tick()
        assert monitor.baseline_phase.value == "frozen"
        return monitor, clock

    def one_period(with_segments: bool, with_inputs: bool) -> IngestTimings:
        monitor, clock = frozen_monitor(with_segments, with_inputs)
        record = monitor.record
        record_ns = fold_ns = scrape_ns = judged_tick_ns = 0
        rotating_ticks_ns = []  # folds that also close a sub-window, as the judging one does
        for second in range(period_s):
            first = second * INGEST_RATE % INGEST_POOL
            chunk = slice(first, first + INGEST_RATE)
            started = time.perf_counter_ns()
            if with_inputs:
                for d, b, h, x in zip(dicts[chunk], batch_list[chunk], hit_list[chunk], inputs_list[chunk]):
                    record("fusion", d, batch_size=b, cache_hit=h, inputs=x)
            elif with_segments:
                for d, b, h in zip(dicts[chunk], batch_list[chunk], hit_list[chunk]):
                    record("fusion", d, batch_size=b, cache_hit=h)
            else:
                for d in dicts[chunk]:
                    record("fusion", d)
            recorded = time.perf_counter_ns()
            clock.advance(1.0)
            is_judged = monitor.tick()
            ticked = time.perf_counter_ns()
            record_ns += recorded - started
            fold_ns += ticked - recorded
            if is_judged:
                judged_tick_ns = ticked - recorded
            elif (second + 1) % round(config.sub_window_s) == 0:
                rotating_ticks_ns.append(ticked - recorded)
            if (second + 1) % SCRAPE_EVERY_S == 0:
                monitor.export_snapshot()
                scrape_ns += time.perf_counter_ns() - ticked
        assert judged_tick_ns, "the period was not judged"
        num_scrapes = period_s // SCRAPE_EVERY_S
        return IngestTimings(
            record_ns=record_ns / num_requests,
            fold_ns=fold_ns / num_requests,
            scrape_ns=scrape_ns / num_requests,
            judgement_ms=(judged_tick_ns - statistics.median(rotating_ticks_ns)) / 1e6,
            scrape_ms=scrape_ns / num_scrapes / 1e6,
        )

    def median_timings(with_segments: bool, with_inputs: bool = False, repeats: int = 3) -> IngestTimings:
        runs = [one_period(with_segments, with_inputs) for _ in range(repeats)]
        return IngestTimings(*(statistics.median(getattr(r, f) for r in runs) for f in IngestTimings.__annotations__))

    record_ns = statistics.median(record_only(True) for _ in range(3))
    record_plain_ns = statistics.median(record_only(False) for _ in range(3))
    seg = median_timings(True)
    plain = median_timings(False)
    inp = median_timings(True, with_inputs=True)

    # Where the fold time goes: grouping + conversion (Python/numpy) vs the rest (digests, Rust).
    records_seg = [("fusion", d, b, h, None) for d, b, h in zip(dicts, batch_list, hit_list)]
    records_plain = [("fusion", d, None, None, None) for d in dicts]
    records_inp = [("fusion", d, b, h, x) for d, b, h, x in zip(dicts, batch_list, hit_list, inputs_list)]

    def time_fold_records(records: list) -> float:
        elapsed_ns = 0
        for start in range(0, len(records), INGEST_RATE):
            chunk = records[start:start + INGEST_RATE]
            started = time.perf_counter_ns()
            fold_records(chunk)
            elapsed_ns += time.perf_counter_ns() - started
        return elapsed_ns / len(records)

    group_seg = statistics.median(time_fold_records(records_seg) for _ in range(3))
    group_plain = statistics.median(time_fold_records(records_plain) for _ in range(3))
    group_inp = statistics.median(time_fold_records(records_inp) for _ in range(3))
    values_s = rng.lognormal(np.log(0.02), 0.5, 1_000_000)

    def rust_update() -> float:
        digest = TDigest(max_centroids=config.max_centroids)
        started = time.perf_counter_ns()
        for chunk in np.array_split(values_s, 10):
            digest.batch_update(chunk)
        return (time.perf_counter_ns() - started) / values_s.size

    rust_ns = _best_of(3, rust_update)

    def rate(per_record_ns: float) -> str:
        return f"{num_stages * 1e3 / per_record_ns:.2f} M samples/s"

    rows.append((f"ingest ({num_stages} stages/request, {INGEST_RATE} requests/s, a fold every second, "
                 f"one {period_s} s drift period, a scrape every {SCRAPE_EVERY_S} s)", ""))
    rows.append(("  record() per request", f"{record_ns / 1e3:.3f} us with batch_size+cache_hit, "
                                          f"{record_plain_ns / 1e3:.3f} us without (target <= 2 us)"))
    for label, t in (("plain", plain), ("with segments", seg), ("with segments + inputs", inp)):
        rows.append((f"  record + fold, {label}", f"{rate(t.record_ns + t.fold_ns)} "
                                                 f"(record {t.record_ns:.0f} + fold {t.fold_ns:.0f} ns/request)"))
    for label, t in (("plain", plain), ("with segments", seg), ("with segments + inputs", inp)):
        rows.append((f"  record + fold + scrapes, {label}",
                     f"{rate(t.record_ns + t.fold_ns + t.scrape_ns)} (scrapes {t.scrape_ns:.0f} ns/request, "
                     f"inserting what the digests held back included)"))
    for label, t in (("plain", plain), ("with segments", seg), ("with segments + inputs", inp)):
        rows.append((f"  reads per period, {label}", f"drift judgement {t.judgement_ms:.1f} ms, "
                                                    f"one scrape {t.scrape_ms:.1f} ms"))
    for label, t, group in (("plain", plain, group_plain), ("segments", seg, group_seg),
                               ("segments + inputs", inp, group_inp)):
        rows.append((f"  fold breakdown, {label}",
                     f"group+convert {group / num_stages:.0f} ns/sample, digest updates + drain + rotations "
                     f"+ judgement {(t.fold_ns - group) / num_stages:.0f} ns/sample"))
    rows.append(("  Rust batch_update alone",
                 f"{rust_ns:.0f} ns/sample = {1e3 / rust_ns:.1f} M samples/s ceiling per digest"))
    rows.append(("  record() alone", f"{num_stages * 1e3 / record_plain_ns:.1f} M samples/s "
                                    f"({record_plain_ns / num_stages:.0f} ns/sample)"))
    return rows


SCENARIOS = ("stationary", "stall", "creep", "ingest")


def print_table(rows: list[tuple[str, str]]) -> None:
    width = max(len(left) for left, _ in rows)
    for left, right in rows:
        print(f"{left.ljust(width)}  {right}".rstrip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=int, default=60, help="stationary minutes after the baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS),
                        help="which parts to run (default: all)")
    args = parser.parse_args(argv)
    config = MonitorConfig()
    print(f"MonitorConfig: window {config.window_s:.0f} s / {config.num_sub_windows} sub-windows, "
          f"period {config.period_s:.0f} s, baseline {config.baseline_s:.0f} s, threshold {config.threshold}, "
          f"consecutive {config.consecutive}, min_samples {config.min_samples}, tail_ratio {config.tail_ratio}, "
          f"max_centroids {config.max_centroids}")
    print(f"traffic: {', '.join(f'{r} {n}/s' for r, n in RATES.items())}; simulated clock, 1 fold per simulated second")
    print()
    rows: list[tuple[str, str]] = []
    for floor in FLOORS:
        if "stationary" in args.scenarios:
            rows += scenario_stationary(args.seed, args.minutes, floor)
        if "stall" in args.scenarios:
            rows += scenario_stall(args.seed + 1, floor)
        if "creep" in args.scenarios:
            rows += scenario_creep(args.seed + 2, floor)
    if "ingest" in args.scenarios:
        rows += scenario_ingest(args.seed + 3)
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
