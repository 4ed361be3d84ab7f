"""Stand-in servers for the load generator's tests.

The generator is a client, so it is tested against a tiny FastAPI app served
by uvicorn on 127.0.0.1 (a free port, in a thread) that behaves like mmserve
on the wire: ``POST /v1/infer`` answers with the route its modality implies,
``GET /metrics`` exports mmserve-named series from its own registry. The app
records when each request arrived (``time.perf_counter``, the same clock as
the generator, since both live in this process) and can stall once, the way a
server does on a GC pause or a cold model.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

# ``benchmarks`` ships beside the server packages; make the checkout importable
# when pytest is started from its console script rather than ``python -m``.
_REPO_ROOT = str(Path(__file__).resolve().parents[3])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

BATCH_SIZE_BUCKETS = (1, 2, 4, 8)
QUEUE_WAIT_QUANTILES = (0.5, 0.99)
_STARTUP_TIMEOUT_S = 10.0


@dataclass
class ReceivedRequest:
    """What the stand-in saw of one request."""

    received_at_s: float
    route: str
    text: str | None
    image_b64: str | None
    priority: str | None


@dataclass
class StandinState:
    """Everything the stand-in did, for tests to compare the generator's report with."""

    stall_s: float = 0.0
    fold_delay_s: float = 0.0  # a queue wait reaches /metrics this long after it was recorded, as mmserve's fold
    stall_until_s: float | None = None
    num_stalled: int = 0
    received: list[ReceivedRequest] = field(default_factory=list)
    batch_sizes_by_lane: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    queue_waits_s_by_route: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    queue_waits_recorded_at_s_by_route: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cache_events: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    seen_images: set[str] = field(default_factory=set)


class _QueueWaitSummary:
    """A custom collector exporting queue waits as a summary with quantiles, like mmserve's digests."""

    def __init__(self, state: StandinState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        metric = Metric("mmserve_stage_latency_seconds", "Stage latency.", "summary")
        folded_before_s = time.perf_counter() - self._state.fold_delay_s
        for route, all_waits_s in sorted(self._state.queue_waits_s_by_route.items()):
            recorded_at_s = self._state.queue_waits_recorded_at_s_by_route[route]
            waits_s = [wait_s for wait_s, at_s in zip(all_waits_s, recorded_at_s) if at_s <= folded_before_s]
            if not waits_s:
                continue
            ordered = sorted(waits_s)
            for quantile in QUEUE_WAIT_QUANTILES:
                rank = max(1, int(quantile * len(ordered) + 0.999999))
                labels = {"route": route, "stage": "queue", "quantile": str(quantile)}
                metric.add_sample("mmserve_stage_latency_seconds", labels, ordered[rank - 1])
            labels = {"route": route, "stage": "queue"}
            metric.add_sample("mmserve_stage_latency_seconds_sum", labels, sum(waits_s))
            metric.add_sample("mmserve_stage_latency_seconds_count", labels, float(len(waits_s)))
        yield metric


def build_standin_app(state: StandinState, registry: CollectorRegistry) -> FastAPI:
    """The stand-in: routes by modality, stalls once if asked, keeps mmserve-named metrics."""
    app = FastAPI()
    batch_size = Histogram(
        "mmserve_batch_size", "Batch size.", ("lane",), buckets=BATCH_SIZE_BUCKETS, registry=registry
    )
    queue_depth = Gauge("mmserve_queue_depth", "Queue depth.", ("lane",), registry=registry)
    cache_events = Counter("mmserve_cache_events", "Cache events.", ("modality", "event"), registry=registry)
    registry.register(_QueueWaitSummary(state))

    @app.post("/v1/infer")
    async def infer(request: Request) -> Response:
        received_at_s = time.perf_counter()
        body = await request.json()
        text = body.get("text")
        image_b64 = (body.get("image") or {}).get("b64")
        route = "fusion" if text and image_b64 else ("vision" if image_b64 else "text")
        state.received.append(ReceivedRequest(received_at_s, route, text, image_b64, body.get("priority")))

        if state.stall_s > 0:
            if state.stall_until_s is None:
                state.stall_until_s = received_at_s + state.stall_s
            if received_at_s < state.stall_until_s:
                state.num_stalled += 1
                await asyncio.sleep(state.stall_until_s - received_at_s)

        lane_batches = state.batch_sizes_by_lane[route]
        size = 1 + len(lane_batches) % 3
        lane_batches.append(size)
        batch_size.labels(lane=route).observe(size)
        queue_depth.labels(lane=route).set(len(lane_batches) % 5)
        state.queue_waits_s_by_route[route].append(0.001 * (1 + len(state.received) % 7))
        state.queue_waits_recorded_at_s_by_route[route].append(time.perf_counter())
        if image_b64 is not None:
            event = "hit" if image_b64 in state.seen_images else "miss"
            state.seen_images.add(image_b64)
            state.cache_events[("image", event)] += 1
            cache_events.labels(modality="image", event=event).inc()
        if text is not None:
            state.cache_events[("text", "miss")] += 1
            cache_events.labels(modality="text", event="miss").inc()
        return JSONResponse({"id": str(len(state.received)), "route": route, "timings_ms": {"total": 0.1}})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Run ``app`` under uvicorn in a thread on a free 127.0.0.1 port; yields the base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline_s = time.monotonic() + _STARTUP_TIMEOUT_S
    while not server.started:
        if time.monotonic() > deadline_s or not thread.is_alive():
            raise RuntimeError("stand-in server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=_STARTUP_TIMEOUT_S)
        sock.close()


@dataclass
class Standin:
    url: str
    state: StandinState


@pytest.fixture(scope="module")
def start_standin() -> Iterator[Callable[..., Standin]]:
    """A factory: ``start_standin(stall_s=1.5)`` starts a fresh stand-in; all stop with the module."""
    with ExitStack() as stack:

        def start(stall_s: float = 0.0, fold_delay_s: float = 0.0) -> Standin:
            state = StandinState(stall_s=stall_s, fold_delay_s=fold_delay_s)
            url = stack.enter_context(serve(build_standin_app(state, CollectorRegistry())))
            return Standin(url, state)

        yield start


@pytest.fixture
def standin() -> Iterator[Standin]:
    """A well-behaved stand-in server (no stall) for one test."""
    state = StandinState()
    with serve(build_standin_app(state, CollectorRegistry())) as url:
        yield Standin(url, state)
