"""What the monitor's folder thread costs a server at 10k requests/s: the ``ingest`` part of drift_detection.

A monitor with the server's configuration (``MonitorConfig()``) learns its
baseline from a trickle of the same traffic, so that drift is judged; then
one drift period of 10k requests per simulated second is recorded, folded
every second (rotating a sub-window every 10 s), judged once, and scraped
every 15 s, all timed. Three variants: plain, with batch size + cache
outcome, and with those plus the request's inputs (counted per input value
for attribution). Then where the fold time goes: grouping and conversion
(Python/numpy) against the digest updates (Rust), and the record call alone.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np
from fastdigest import TDigest

from benchmarks.drift_traffic import VISION_SIGMA, sample_route
from monitoring import ManualClock, Monitor, MonitorConfig, RequestInputs
from monitoring.ingest import fold_records

INGEST_RATE = 10_000  # requests per simulated second; the folder folds once a second
INGEST_POOL = 100_000  # distinct requests, cycled
SCRAPE_EVERY_S = 15  # a Prometheus scrape interval
BASELINE_TRICKLE = 100  # requests per second while the baseline is learned
REPEATS = 3


@dataclass
class IngestTimings:
    """Nanoseconds per request of one simulated drift period at ``INGEST_RATE``."""

    record_ns: float
    fold_ns: float  # every tick: drain, group, convert, digest updates, rotations, the drift judgement
    scrape_ns: float
    judgement_ms: float  # the judging tick minus another rotating one: the reads the drift judgement makes
    scrape_ms: float  # one scrape (export_snapshot)


@dataclass(frozen=True)
class RequestPool:
    """``INGEST_POOL`` fusion requests, cycled: stage times, batch sizes, cache hits and inputs, per request."""

    stage_names: tuple[str, ...]
    stages: list[dict[str, int]]
    batch_sizes: list[int]
    cache_hits: list[bool]
    inputs: list[RequestInputs]

    @classmethod
    def draw(cls, rng: np.random.Generator) -> RequestPool:
        names, columns, batch, hits = sample_route("fusion", rng, INGEST_POOL, VISION_SIGMA, 0.0, 0.0)
        stages = [dict(zip(names, values)) for values in zip(*[c.tolist() for c in columns])]
        # What fusion requests carry: a few encodings and sizes, texts of several lengths.
        kinds = [RequestInputs.of(largest_image_pixels=pixels, image_encoding=encoding, num_text_tokens=tokens,
                                  num_images=1, priority="normal", protocol="native")
                 for pixels in (200_000, 2_000_000) for encoding in ("jpeg", "png", "raw_uint8")
                 for tokens in (8, 40)]
        inputs = [kinds[i] for i in rng.integers(0, len(kinds), INGEST_POOL).tolist()]
        return cls(tuple(names), stages, batch.tolist(), hits.tolist(), inputs)

    def record(self, monitor: Monitor, requests: slice | None, with_segments: bool, with_inputs: bool) -> None:
        """``monitor.record`` for each request of ``requests`` (None: the whole pool), with what the variant carries."""
        record = monitor.record

        def take(values: list) -> list:
            return values if requests is None else values[requests]

        if with_inputs:
            for d, b, h, x in zip(take(self.stages), take(self.batch_sizes), take(self.cache_hits),
                                  take(self.inputs)):
                record("fusion", d, batch_size=b, cache_hit=h, inputs=x)
        elif with_segments:
            for d, b, h in zip(take(self.stages), take(self.batch_sizes), take(self.cache_hits)):
                record("fusion", d, batch_size=b, cache_hit=h)
        else:
            for d in take(self.stages):
                record("fusion", d)

    def records(self, with_segments: bool, with_inputs: bool) -> list[tuple]:
        """The records the folder drains, as ``fold_records`` takes them."""
        if with_inputs:
            return [("fusion", d, b, h, x)
                    for d, b, h, x in zip(self.stages, self.batch_sizes, self.cache_hits, self.inputs)]
        if with_segments:
            return [("fusion", d, b, h, None) for d, b, h in zip(self.stages, self.batch_sizes, self.cache_hits)]
        return [("fusion", d, None, None, None) for d in self.stages]


def record_only_ns(pool: RequestPool, with_segments: bool) -> float:
    """Nanoseconds per ``record`` call over the whole pool, nothing folded."""
    monitor = Monitor(clock=ManualClock())
    started = time.perf_counter_ns()
    pool.record(monitor, None, with_segments, with_inputs=False)
    return (time.perf_counter_ns() - started) / len(pool.stages)


def frozen_monitor(pool: RequestPool, config: MonitorConfig, with_segments: bool,
                   with_inputs: bool) -> tuple[Monitor, ManualClock]:
    """A monitor whose baseline was learned from ``BASELINE_TRICKLE`` requests/s, so the next period is judged."""
    clock = ManualClock()
    monitor = Monitor(config, clock=clock)
    monitor.mark_ready()
    for second in range(int(config.baseline_s)):
        first = second * BASELINE_TRICKLE % INGEST_POOL
        for i in range(first, first + BASELINE_TRICKLE):
            monitor.record("fusion", pool.stages[i], batch_size=pool.batch_sizes[i] if with_segments else None,
                           cache_hit=pool.cache_hits[i] if with_segments else None,
                           inputs=pool.inputs[i] if with_inputs else None)
        clock.advance(1.0)
        monitor.tick()
    assert monitor.baseline_phase.value == "frozen"
    return monitor, clock


def one_period(pool: RequestPool, config: MonitorConfig, with_segments: bool, with_inputs: bool) -> IngestTimings:
    """One drift period at ``INGEST_RATE``: record, fold every second, scrape every ``SCRAPE_EVERY_S``, timed."""
    monitor, clock = frozen_monitor(pool, config, with_segments, with_inputs)
    period_s = int(config.period_s)
    record_ns = fold_ns = scrape_ns = judged_tick_ns = 0
    rotating_ticks_ns = []  # folds that also close a sub-window, as the judging one does
    for second in range(period_s):
        first = second * INGEST_RATE % INGEST_POOL
        started = time.perf_counter_ns()
        pool.record(monitor, slice(first, first + INGEST_RATE), with_segments, with_inputs)
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
    num_requests = period_s * INGEST_RATE
    return IngestTimings(
        record_ns=record_ns / num_requests,
        fold_ns=fold_ns / num_requests,
        scrape_ns=scrape_ns / num_requests,
        judgement_ms=(judged_tick_ns - statistics.median(rotating_ticks_ns)) / 1e6,
        scrape_ms=scrape_ns / (period_s // SCRAPE_EVERY_S) / 1e6,
    )


def median_timings(pool: RequestPool, config: MonitorConfig, with_segments: bool,
                   with_inputs: bool = False) -> IngestTimings:
    runs = [one_period(pool, config, with_segments, with_inputs) for _ in range(REPEATS)]
    return IngestTimings(*(statistics.median(getattr(r, f.name) for r in runs) for f in fields(IngestTimings)))


def fold_records_ns(records: list[tuple]) -> float:
    """Nanoseconds per record of ``fold_records`` (grouping + conversion), a second's worth at a time."""
    elapsed_ns = 0
    for start in range(0, len(records), INGEST_RATE):
        chunk = records[start:start + INGEST_RATE]
        started = time.perf_counter_ns()
        fold_records(chunk)
        elapsed_ns += time.perf_counter_ns() - started
    return elapsed_ns / len(records)


def digest_update_ns(values_s: np.ndarray, max_centroids: int) -> float:
    """Nanoseconds per value of the Rust digest's ``batch_update`` alone, in ten chunks."""
    digest = TDigest(max_centroids=max_centroids)
    started = time.perf_counter_ns()
    for chunk in np.array_split(values_s, 10):
        digest.batch_update(chunk)
    return (time.perf_counter_ns() - started) / values_s.size


def _best_of(repeats: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(repeats))


def scenario_ingest(seed: int) -> list[tuple[str, str]]:
    """The ingest rows of drift_detection's table: rates, reads per period, where the fold time goes."""
    rng = np.random.default_rng(seed)
    config = MonitorConfig()
    pool = RequestPool.draw(rng)
    num_stages = len(pool.stage_names)
    period_s = int(config.period_s)

    record_ns = statistics.median(record_only_ns(pool, True) for _ in range(REPEATS))
    record_plain_ns = statistics.median(record_only_ns(pool, False) for _ in range(REPEATS))
    seg = median_timings(pool, config, True)
    plain = median_timings(pool, config, False)
    inp = median_timings(pool, config, True, with_inputs=True)
    # Where the fold time goes: grouping + conversion (Python/numpy) vs the rest (digests, Rust).
    records = {variant: pool.records(*variant) for variant in ((True, False), (False, False), (True, True))}
    group_seg, group_plain, group_inp = (statistics.median(fold_records_ns(chunked) for _ in range(REPEATS))
                                         for chunked in records.values())
    values_s = rng.lognormal(np.log(0.02), 0.5, 1_000_000)
    rust_ns = _best_of(REPEATS, lambda: digest_update_ns(values_s, config.max_centroids))

    def rate(per_record_ns: float) -> str:
        return f"{num_stages * 1e3 / per_record_ns:.2f} M samples/s"

    variants = (("plain", plain), ("with segments", seg), ("with segments + inputs", inp))
    rows = [(f"ingest ({num_stages} stages/request, {INGEST_RATE} requests/s, a fold every second, "
             f"one {period_s} s drift period, a scrape every {SCRAPE_EVERY_S} s)", ""),
            ("  record() per request", f"{record_ns / 1e3:.3f} us with batch_size+cache_hit, "
                                      f"{record_plain_ns / 1e3:.3f} us without (target <= 2 us)")]
    rows += [(f"  record + fold, {label}", f"{rate(t.record_ns + t.fold_ns)} "
                                          f"(record {t.record_ns:.0f} + fold {t.fold_ns:.0f} ns/request)")
             for label, t in variants]
    rows += [(f"  record + fold + scrapes, {label}",
              f"{rate(t.record_ns + t.fold_ns + t.scrape_ns)} (scrapes {t.scrape_ns:.0f} ns/request, "
              f"inserting what the digests held back included)") for label, t in variants]
    rows += [(f"  reads per period, {label}", f"drift judgement {t.judgement_ms:.1f} ms, "
                                             f"one scrape {t.scrape_ms:.1f} ms") for label, t in variants]
    rows += [(f"  fold breakdown, {label}",
              f"group+convert {group / num_stages:.0f} ns/sample, digest updates + drain + rotations "
              f"+ judgement {(t.fold_ns - group) / num_stages:.0f} ns/sample")
             for label, t, group in (("plain", plain, group_plain), ("segments", seg, group_seg),
                                     ("segments + inputs", inp, group_inp))]
    rows.append(("  Rust batch_update alone",
                 f"{rust_ns:.0f} ns/sample = {1e3 / rust_ns:.1f} M samples/s ceiling per digest"))
    rows.append(("  record() alone", f"{num_stages * 1e3 / record_plain_ns:.1f} M samples/s "
                                    f"({record_plain_ns / num_stages:.0f} ns/sample)"))
    return rows
