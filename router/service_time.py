"""How long a batch of a given size takes, per lane: learned at warm-up, updated online.

The batcher uses it to close a batch early when waiting longer would make
its most urgent request miss its deadline; admission control uses it to
estimate a new request's wait. An exponentially weighted mean per (lane,
padded batch size) follows drift without being thrown by one outlier; a size
never measured is interpolated from its neighbours (linear in the size).
"""

from __future__ import annotations

import threading

from router.request import Route


class ServiceTimeEstimator:
    def __init__(self, smoothing: float = 0.2) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError("smoothing must lie in (0, 1]")
        self._smoothing = smoothing
        self._mean_ns: dict[tuple[Route, int], float] = {}
        # Each lane's (size, mean) pairs in size order, rebuilt on observe: admission estimates several
        # times per request, a batch observes once.
        self._known: dict[Route, tuple[tuple[int, float], ...]] = {}
        self._slowest_ns: dict[Route, int] = {}
        self._lock = threading.Lock()

    def observe(self, route: Route, batch_size: int, elapsed_ns: int) -> None:
        key = (route, batch_size)
        with self._lock:
            previous = self._mean_ns.get(key)
            self._mean_ns[key] = float(elapsed_ns) if previous is None else (
                previous + self._smoothing * (elapsed_ns - previous)
            )
            self._known[route] = tuple(sorted((size, mean) for (lane, size), mean in self._mean_ns.items()
                                              if lane == route))
            self._slowest_ns[route] = int(max(mean for _, mean in self._known[route]))

    def slowest_ns(self, route: Route) -> int:
        """The longest measured batch of ``route`` (0 when none was): a bound on the estimate of any batch
        size up to the largest measured, where interpolation never exceeds its neighbours."""
        return self._slowest_ns.get(route, 0)

    def estimate_ns(self, route: Route, batch_size: int) -> int:
        """Expected time of a batch; 0 when nothing of this lane was measured yet."""
        known = self._known.get(route)  # replaced whole under the lock, never changed in place
        if not known:
            return 0
        for size, mean in known:
            if size == batch_size:
                return int(mean)
        below = [(s, m) for s, m in known if s < batch_size]
        above = [(s, m) for s, m in known if s > batch_size]
        if below and above:
            (s0, m0), (s1, m1) = below[-1], above[0]
            return int(m0 + (m1 - m0) * (batch_size - s0) / (s1 - s0))
        size, mean = (below[-1] if below else above[0])
        return int(mean * batch_size / size)  # beyond the measured range: proportional
