"""Simulated per-stage latencies of a served mix, fed to a ``monitoring.Monitor`` on a manual clock.

Requests come in batches of 1 to 16 that share their compute stages
(``vision``, ``text``, ``fusion``; a stall delays a whole batch), while decode,
queue, respond and cache reads are each request's own. A ``Simulation`` turns
the knobs a scenario needs and calls back on every drift period.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from monitoring import ManualClock, Monitor, MonitorConfig

# Per route: requests per second.
RATES = {"text": 400, "vision": 150, "fusion": 150}
VISION_MEDIAN_S = 0.020
VISION_SIGMA = 0.2
FUSION_CACHE_HIT_RATIO = 0.6
BATCH_SIZES = np.array([1, 2, 4, 8, 16])

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


def new_simulation(seed: int) -> Simulation:
    """A simulation whose monitor has learned its baseline (30 s of warm-up first)."""
    clock = ManualClock()
    sim = Simulation(Monitor(MonitorConfig(), clock=clock), clock, np.random.default_rng(seed))
    sim.run(30)  # warm-up traffic before readiness, kept out of the baseline
    sim.monitor.mark_ready()
    sim.run(int(sim.monitor.config.baseline_s))
    assert sim.monitor.baseline_phase.value == "frozen"
    return sim


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
