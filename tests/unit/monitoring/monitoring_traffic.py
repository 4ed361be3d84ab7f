"""A traffic simulator for the monitoring tests: a ``Monitor`` on a ``ManualClock``.

The simulator plays requests one simulated second at a time: it records
``rate`` requests through ``Monitor.record`` (the real hot path), advances the
clock by one second and calls ``Monitor.tick`` (the real folder), exactly what
the background thread does in production, minus the waiting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from monitoring import ManualClock, Monitor, RouteDriftStatus

StageSampler = Callable[[np.random.Generator, int, float, "np.ndarray | None"], dict[str, np.ndarray]]
"""``sampler(rng, num_requests, now_s, cache_hits) -> {stage: int64 ns array}``.

``cache_hits`` is a bool array (or ``None`` when the run records no cache
outcome), so latencies can depend on it; ``total`` is added as the sum.
"""


@dataclass
class TrafficSimulator:
    """Drives a ``Monitor`` on a ``ManualClock`` with synthetic per-stage latencies.

    ``evaluations`` collects ``(monotonic_s, {route: status})`` after every judged period.
    """

    monitor: Monitor
    clock: ManualClock
    rng: np.random.Generator
    route: str = "vision"
    evaluations: list[tuple[float, dict[str, RouteDriftStatus]]] = field(default_factory=list)

    def run(
        self,
        seconds: int,
        rate: int,
        sampler: StageSampler,
        *,
        batch_sizes: np.ndarray | None = None,
        cache_hit_ratio: float | None = None,
    ) -> list[dict[str, np.ndarray]]:
        """Play ``seconds`` of traffic; returns the per-second stage arrays (``total`` included)."""
        played = []
        for _ in range(seconds):
            hits = self.rng.random(rate) < cache_hit_ratio if cache_hit_ratio is not None else None
            stages = sampler(self.rng, rate, self.clock.monotonic_s(), hits)
            stages["total"] = np.sum(list(stages.values()), axis=0)
            names = list(stages)
            columns = [stages[name].tolist() for name in names]
            hit_list = hits.tolist() if hits is not None else None
            sizes = batch_sizes.tolist() if batch_sizes is not None else None
            record = self.monitor.record
            for i, values in enumerate(zip(*columns)):
                record(
                    self.route,
                    dict(zip(names, values)),
                    batch_size=sizes[i % len(sizes)] if sizes is not None else None,
                    cache_hit=hit_list[i] if hit_list is not None else None,
                )
            self.clock.advance(1.0)
            if self.monitor.tick():
                self.evaluations.append((self.clock.monotonic_s(), self.monitor.drift_status()))
            played.append(stages)
        return played

    def states(self) -> list[str]:
        """The route's state after each judged period, in order."""
        return [statuses[self.route].state.value for _, statuses in self.evaluations if self.route in statuses]


def lognormal_ns(rng: np.random.Generator, median_s: float, sigma: float, n: int) -> np.ndarray:
    """``n`` lognormal latencies in integer nanoseconds with the given median."""
    return rng.lognormal(np.log(median_s * 1e9), sigma, n).astype(np.int64)
