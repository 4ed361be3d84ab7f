"""The alert drill end to end: steady load, a learned baseline, a vision stall, drift raised on vision, cleared.

Windows are shrunk so the drill fits in seconds: drift is judged every 0.5 s
over a 3 s window against a 3 s baseline. One client sends image-only
requests back to back, each with a new image, so every request runs the
vision stage and nothing waits behind another request's batch (a queue that
grew behind a stalled batch would rightly be named instead of vision).

Why the drill here stalls every vision batch (fraction 1.0) rather than the
operators' 20 %: the KS statistic is a rank statistic, so a 20 % stall moves
D to about 0.2 however long the stall, and on two shared cores a neighbour
starting or stopping work moves these tight, CPU-bound latencies by a D of
0.1 to 0.6 within seconds. A test cannot tell those apart; a full stall
(D near 1, against a threshold of 0.75) it always can. Stage timing of a
partial drill is checked in test_monitoring_live.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

PERIOD_S = 0.5
WINDOW_S = 3.0
BASELINE_S = 3.0
CONSECUTIVE = 3
THRESHOLD = 0.75
DRILL = {"stage": "vision", "delay_ms": 172, "fraction": 1.0, "duration_s": 30}
# One period may straddle the injection; the window must then fill with stalled
# requests (few: each takes 172 ms) before CONSECUTIVE shifted periods raise drift.
RAISE_WITHIN_S = WINDOW_S + (CONSECUTIVE + 2) * PERIOD_S + 3.0
CLEAR_WITHIN_S = WINDOW_S + (CONSECUTIVE + 2) * PERIOD_S + 3.0


class SteadyLoad:
    """Image-only requests back to back from one thread, bounded in count and time."""

    def __init__(self, url: str, max_requests: int = 20_000, max_duration_s: float = 50.0) -> None:
        self._url = url
        self._max_requests = max_requests
        self._max_duration_s = max_duration_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-load", daemon=True)
        self.num_ok = 0
        self.failures: list[str] = []

    def _run(self) -> None:
        rng = np.random.default_rng(7)
        deadline = time.monotonic() + self._max_duration_s
        with httpx.Client(base_url=self._url, timeout=30.0) as client:
            for _ in range(self._max_requests):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                body = {"image": {"uint8": {"shape": [32, 32, 3], "b64": base64.b64encode(pixels.tobytes()).decode()}}}
                response = client.post("/v1/infer", json=body)
                if response.status_code == 200:
                    self.num_ok += 1
                else:
                    self.failures.append(f"{response.status_code} {response.text[:200]}")

    def __enter__(self) -> SteadyLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def vision_route(client: httpx.Client) -> dict:
    return client.get("/v1/monitoring/drift").json()["routes"]["vision"]


def wait_for_route(client: httpx.Client, predicate: Callable[[dict], bool], timeout_s: float, what: str) -> dict:
    """The vision route's drift entry once ``predicate`` holds for it (polled every 0.1 s)."""
    deadline = time.monotonic() + timeout_s
    route = None
    while time.monotonic() < deadline:
        route = vision_route(client)
        if predicate(route):
            return route
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout_s:.1f} s; last vision entry: {route!r}")


def drift_gauges(client: httpx.Client) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    active, ks = {}, {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "mmserve_drift_active":
                active[sample.labels["route"]] = sample.value
            elif sample.name == "mmserve_drift_ks_statistic":
                ks[(sample.labels["route"], sample.labels["stage"])] = sample.value
    return active, ks


def test_a_vision_stall_raises_drift_named_vision_and_it_clears_when_the_stall_ends(live_server_factory):
    settings = dict(enable_fault_injection=True, max_queue_delay_ms=0, drift_period_s=PERIOD_S,
                    drift_window_s=WINDOW_S, drift_baseline_s=BASELINE_S, drift_consecutive=CONSECUTIVE,
                    drift_threshold=THRESHOLD, drift_min_samples=10)
    with live_server_factory(**settings) as server, server.client() as client, SteadyLoad(server.url) as load:
        # Learn the baseline from steady traffic, not from the first requests of a cold process.
        deadline = time.monotonic() + 10.0
        while load.num_ok < 50:
            assert time.monotonic() < deadline and not load.failures, (load.num_ok, load.failures[:3])
            time.sleep(0.05)
        relearn = client.post("/v1/monitoring/baseline")
        assert relearn.status_code == 200, relearn.text
        assert relearn.json()["baseline"]["phase"] == "learning"
        before = wait_for_route(client, lambda r: r["state"] == "stable" and r["evaluated_unix_s"] is not None,
                                BASELINE_S + 3.0, "baseline frozen and a period judged")
        assert before["active"] is False, before

        injected = client.post("/v1/admin/faults", json=DRILL)
        assert injected.status_code == 200, injected.text
        injected_s = time.monotonic()
        first_shifted_s: list[float] = []

        def is_raised(route: dict) -> bool:
            if route["period_shifted"] and not first_shifted_s:
                first_shifted_s.append(time.monotonic())
            return route["active"]

        raised = wait_for_route(client, is_raised, RAISE_WITHIN_S, "drift on the vision route")
        raised_s = time.monotonic()
        assert raised["state"] == "drifting"
        assert raised["attributed_stage"] == "vision", raised["attribution"]
        assert raised["ks"]["total"] > THRESHOLD and raised["ks"]["vision"] > THRESHOLD, raised["ks"]
        # Raised by CONSECUTIVE shifted periods in a row: not on the first one, and not much later.
        assert first_shifted_s, "drift was raised without a shifted period being seen"
        shifted_for_s = raised_s - first_shifted_s[0]
        assert (CONSECUTIVE - 2) * PERIOD_S <= shifted_for_s <= CONSECUTIVE * PERIOD_S + 0.5, shifted_for_s
        assert raised["since_unix_s"] >= time.time() - (raised_s - injected_s) - 0.5
        active, ks = drift_gauges(client)
        assert active["vision"] == 1.0
        assert ks[("vision", "vision")] > THRESHOLD

        cleared = client.delete("/v1/admin/faults")
        assert cleared.status_code == 200
        calm = wait_for_route(client, lambda r: not r["active"], CLEAR_WITHIN_S, "drift clearing after the stall ended")
        assert calm["state"] == "stable"
        assert calm["since_unix_s"] > raised["since_unix_s"]
        active, _ = drift_gauges(client)
        assert active["vision"] == 0.0
    assert not load.failures, load.failures[:3]
