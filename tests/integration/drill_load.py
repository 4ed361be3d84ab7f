"""Steady load and drift polling shared by the drift drills (tests/integration/test_drift_drill*.py)."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from encoded_images import encoded_image_b64


class SteadyLoad:
    """Image-only requests back to back from ``num_clients`` threads, bounded in count and time.

    Every request carries a new image, so every request runs the vision
    stage; each client waits for its answer before sending again, so the
    queue holds at most ``num_clients`` requests.
    """

    def __init__(self, url: str, num_clients: int = 1, max_requests: int = 20_000,
                 max_duration_s: float = 50.0, image_size: int = 32) -> None:
        self._url = url
        self._max_requests = max_requests
        self._max_duration_s = max_duration_s
        self._image_size = image_size
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(seed,), name=f"steady-load-{seed}", daemon=True)
                         for seed in range(num_clients)]
        self._lock = threading.Lock()
        self.num_ok = 0
        self.failures: list[str] = []

    def _run(self, seed: int) -> None:
        rng = np.random.default_rng(7 + seed)
        deadline = time.monotonic() + self._max_duration_s
        shape = [self._image_size, self._image_size, 3]
        with httpx.Client(base_url=self._url, timeout=30.0) as client:
            for _ in range(self._max_requests):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
                pixels = rng.integers(0, 256, shape, dtype=np.uint8)
                body = {"image": {"uint8": {"shape": shape, "b64": base64.b64encode(pixels.tobytes()).decode()}}}
                response = client.post("/v1/infer", json=body)
                with self._lock:
                    if response.status_code == 200:
                        self.num_ok += 1
                    else:
                        self.failures.append(f"{response.status_code} {response.text[:200]}")

    def wait_for(self, num_ok: int, timeout_s: float) -> None:
        """Until ``num_ok`` answers arrived; fails on the first failure or at the timeout."""
        deadline = time.monotonic() + timeout_s
        while self.num_ok < num_ok:
            assert time.monotonic() < deadline and not self.failures, (self.num_ok, self.failures[:3])
            time.sleep(0.05)

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


class PngJpegLoad:
    """PNG and JPEG requests in turn from each of ``num_clients`` threads, each a new 32 x 32 image, bounded."""

    def __init__(self, url: str, num_clients: int = 1, max_requests: int = 20_000,
                 max_duration_s: float = 60.0) -> None:
        self._url = url
        self._max_requests = max_requests
        self._max_duration_s = max_duration_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(client,), name=f"png-jpeg-load-{client}",
                                          daemon=True) for client in range(num_clients)]
        self._num_clients = num_clients
        self.num_ok = 0
        self.failures: list[str] = []

    def _run(self, client_index: int) -> None:
        deadline = time.monotonic() + self._max_duration_s
        with httpx.Client(base_url=self._url, timeout=30.0) as client:
            # Seeds client_index, client_index + n, ...: every image is new, and each client alternates.
            for seed in range(client_index, self._max_requests, self._num_clients):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
                fmt = "PNG" if (seed // self._num_clients) % 2 else "JPEG"
                response = client.post("/v1/infer", json={"image": {"b64": encoded_image_b64(seed, (32, 32), fmt)}})
                with self._lock:
                    if response.status_code == 200:
                        self.num_ok += 1
                    else:
                        self.failures.append(f"{response.status_code} {response.text[:200]}")

    def __enter__(self) -> PngJpegLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


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
