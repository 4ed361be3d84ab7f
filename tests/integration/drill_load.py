"""Steady load and drift polling shared by the drift drills (tests/integration/test_drift_drill*.py)."""

from __future__ import annotations

import abc
import base64
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Self

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from encoded_images import encoded_image_b64


class ClosedLoopLoad(abc.ABC):
    """``/v1/infer`` bodies back to back from ``num_clients`` threads, each bounded in count and time.

    Each client waits for its answer before sending again, so the queue holds
    at most ``num_clients`` requests. Subclasses say what each client sends.
    """

    def __init__(self, url: str, num_clients: int = 1, max_requests: int = 20_000,
                 max_duration_s: float = 50.0) -> None:
        self._url = url
        self._num_clients = num_clients
        self._max_requests = max_requests  # per client
        self._max_duration_s = max_duration_s
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(index,), name=f"drill-load-{index}", daemon=True)
                         for index in range(num_clients)]
        self._lock = threading.Lock()
        self.num_ok = 0
        self.failures: list[str] = []

    @abc.abstractmethod
    def _bodies(self, client_index: int) -> Iterator[dict]:
        """What client ``client_index`` sends, request after request."""

    def _run(self, client_index: int) -> None:
        deadline = time.monotonic() + self._max_duration_s
        with httpx.Client(base_url=self._url, timeout=30.0) as client:
            for _, body in zip(range(self._max_requests), self._bodies(client_index)):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
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

    def __enter__(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


class SteadyLoad(ClosedLoopLoad):
    """A new raw uint8 image in every request, so every request runs the vision stage."""

    def __init__(self, url: str, num_clients: int = 1, max_requests: int = 20_000,
                 max_duration_s: float = 50.0, image_size: int = 32) -> None:
        super().__init__(url, num_clients, max_requests, max_duration_s)
        self._shape = [image_size, image_size, 3]

    def _bodies(self, client_index: int) -> Iterator[dict]:
        rng = np.random.default_rng(7 + client_index)
        while True:
            pixels = rng.integers(0, 256, self._shape, dtype=np.uint8)
            yield {"image": {"uint8": {"shape": self._shape, "b64": base64.b64encode(pixels.tobytes()).decode()}}}


class PngJpegLoad(ClosedLoopLoad):
    """A new 32 x 32 image in every request, PNG and JPEG in turn from each client (every one is decoded)."""

    def _bodies(self, client_index: int) -> Iterator[dict]:
        # Seeds client_index, client_index + n, ...: no two requests send the same image.
        for turn, seed in enumerate(itertools.count(client_index, self._num_clients)):
            yield {"image": {"b64": encoded_image_b64(seed, (32, 32), "PNG" if turn % 2 else "JPEG")}}


def vision_route(client: httpx.Client) -> dict:
    return client.get("/v1/monitoring/drift").json()["routes"]["vision"]


def wait_for_route(client: httpx.Client, predicate: Callable[[dict], bool], timeout_s: float, what: str,
                   not_before_s: float = 0.0) -> dict:
    """The vision route's drift entry once ``predicate`` holds for it (polled every 0.1 s), and no sooner than
    ``not_before_s`` from now (a drill judged once a whole window holds its traffic)."""
    started = time.monotonic()
    deadline = started + timeout_s
    route = None
    while time.monotonic() < deadline:
        route = vision_route(client)
        if time.monotonic() >= started + not_before_s and predicate(route):
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
