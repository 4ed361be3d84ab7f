"""The before/after ``/metrics`` diff: batch sizes, queue waits, cache hit ratio, absent series."""

from __future__ import annotations

import asyncio
import bisect
import math
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from benchmarks.loadgen.server_metrics import (
    ScrapeResult,
    cache_view,
    parse_metrics_text,
    scrape,
    server_view,
)

BUCKETS = (1, 2, 4, 8)


class QueueSummary:
    """Exports ``mmserve_stage_latency_seconds{stage="queue"}`` like a digest-backed summary."""

    def __init__(self) -> None:
        self.waits_s: dict[str, list[float]] = {}

    def collect(self) -> Iterator[Metric]:
        metric = Metric("mmserve_stage_latency_seconds", "Stage latency.", "summary")
        for route, waits in self.waits_s.items():
            ordered = sorted(waits)
            for quantile in (0.5, 0.99):
                value = ordered[max(0, math.ceil(quantile * len(ordered)) - 1)]
                labels = {"route": route, "stage": "queue", "quantile": str(quantile)}
                metric.add_sample("mmserve_stage_latency_seconds", labels, value)
            labels = {"route": route, "stage": "queue"}
            metric.add_sample("mmserve_stage_latency_seconds_sum", labels, sum(waits))
            metric.add_sample("mmserve_stage_latency_seconds_count", labels, float(len(waits)))
        yield metric


class FakeServerMetrics:
    """A registry with mmserve's series, driven directly by the test."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.batch_size = Histogram("mmserve_batch_size", "b", ("lane",), buckets=BUCKETS, registry=self.registry)
        self.queue_depth = Gauge("mmserve_queue_depth", "q", ("lane",), registry=self.registry)
        self.cache_events = Counter("mmserve_cache_events", "c", ("modality", "event"), registry=self.registry)
        self.queue = QueueSummary()
        self.registry.register(self.queue)

    def text(self) -> str:
        return generate_latest(self.registry).decode("utf-8")


def _bucket_counts(observations: list[int]) -> dict[float, int]:
    """Non-cumulative count per bucket upper bound, the way a histogram files observations."""
    bounds = [float(b) for b in BUCKETS] + [math.inf]
    counts = {bound: 0 for bound in bounds}
    for value in observations:
        counts[bounds[bisect.bisect_left(bounds, value)]] += 1
    return counts


def test_batch_size_view_is_the_runs_share_of_the_histogram() -> None:
    server = FakeServerMetrics()
    for size in (1, 4, 16):
        server.batch_size.labels(lane="vision").observe(size)
    before = parse_metrics_text(server.text())
    run_vision = [2, 3, 8, 8, 5]
    run_text = [1, 1, 2]
    for size in run_vision:
        server.batch_size.labels(lane="vision").observe(size)
    for size in run_text:  # this lane's series did not exist before the run
        server.batch_size.labels(lane="text").observe(size)
    after = parse_metrics_text(server.text())

    view = server_view(ScrapeResult(before, None), ScrapeResult(after, None))
    assert view["scraped"] is True and view["errors"] == []
    for lane, observed in (("vision", run_vision), ("text", run_text)):
        entry = view["batch_size"][lane]
        assert entry["num_batches"] == len(observed)
        assert entry["mean"] == pytest.approx(sum(observed) / len(observed))
        histogram = {float(le): count for le, count in entry["histogram"].items()}
        assert histogram == _bucket_counts(observed)


def test_batch_sizes_and_queue_depths_of_several_engines_add_up_per_lane() -> None:
    """With several engines each engine's series carries ``engine``: the views sum them per lane."""
    registry = CollectorRegistry()
    batch_size = Histogram("mmserve_batch_size", "b", ("lane", "engine"), buckets=BUCKETS, registry=registry)
    queue_depth = Gauge("mmserve_queue_depth", "q", ("lane", "engine"), registry=registry)
    before = parse_metrics_text(generate_latest(registry).decode())
    observed = {"0": [1, 2, 2], "1": [8, 4]}
    for engine, sizes in observed.items():
        for size in sizes:
            batch_size.labels(lane="vision", engine=engine).observe(size)
    queue_depth.labels(lane="vision", engine="0").set(3)
    queue_depth.labels(lane="vision", engine="1").set(5)
    after = parse_metrics_text(generate_latest(registry).decode())

    view = server_view(ScrapeResult(before, None), ScrapeResult(after, None))
    every = [size for sizes in observed.values() for size in sizes]
    entry = view["batch_size"]["vision"]
    assert entry["num_batches"] == len(every)
    assert entry["mean"] == pytest.approx(sum(every) / len(every))
    assert {float(le): count for le, count in entry["histogram"].items()} == _bucket_counts(every)
    assert view["queue_depth"] == {"vision": 8.0}


def test_queue_wait_view_uses_the_summary_delta_and_reports_quantiles() -> None:
    server = FakeServerMetrics()
    server.queue.waits_s["fusion"] = [0.5, 0.5]  # before the run: slow
    before = parse_metrics_text(server.text())
    run_waits_s = [0.002, 0.004, 0.009]
    server.queue.waits_s["fusion"] = server.queue.waits_s["fusion"] + run_waits_s
    after = parse_metrics_text(server.text())

    entry = server_view(ScrapeResult(before, None), ScrapeResult(after, None))["queue_wait"]["fusion"]
    assert entry["count"] == len(run_waits_s)
    assert entry["mean_ms"] == pytest.approx(sum(run_waits_s) / len(run_waits_s) * 1000.0)
    all_waits = sorted(server.queue.waits_s["fusion"])
    assert entry["quantiles_ms"]["0.99"] == pytest.approx(all_waits[-1] * 1000.0)
    assert set(entry["quantiles_ms"]) == {"0.5", "0.99"}


def test_cache_hit_ratio_counts_hits_over_lookups_during_the_run() -> None:
    server = FakeServerMetrics()
    server.cache_events.labels(modality="image", event="miss").inc(50)  # history the run must not count
    before = parse_metrics_text(server.text())
    run = {
        ("image", "hit"): 30,
        ("image", "miss"): 6,
        ("image", "coalesced"): 4,
        ("image", "insert"): 6,
        ("text", "miss"): 10,
    }
    for (modality, event), count in run.items():
        server.cache_events.labels(modality=modality, event=event).inc(count)
    after = parse_metrics_text(server.text())

    view = cache_view(before, after)
    assert view is not None
    image_lookups = run[("image", "hit")] + run[("image", "miss")] + run[("image", "coalesced")]
    assert view["by_modality"]["image"]["hit_ratio"] == pytest.approx(run[("image", "hit")] / image_lookups)
    assert view["by_modality"]["image"]["events"]["insert"] == run[("image", "insert")]
    assert view["by_modality"]["text"]["hit_ratio"] == 0.0
    assert view["hit_ratio"] == pytest.approx(run[("image", "hit")] / (image_lookups + run[("text", "miss")]))


def test_a_counter_that_reset_counts_from_zero() -> None:
    old = FakeServerMetrics()
    old.cache_events.labels(modality="image", event="hit").inc(100)
    restarted = FakeServerMetrics()
    restarted.cache_events.labels(modality="image", event="hit").inc(3)
    restarted.cache_events.labels(modality="image", event="miss").inc(1)
    view = cache_view(parse_metrics_text(old.text()), parse_metrics_text(restarted.text()))
    assert view is not None
    assert view["by_modality"]["image"]["events"]["hit"] == 3
    assert view["hit_ratio"] == pytest.approx(3 / 4)


def test_absent_series_are_null_not_a_crash() -> None:
    registry = CollectorRegistry()
    Counter("unrelated_requests", "x", registry=registry).inc()
    snapshot = parse_metrics_text(generate_latest(registry).decode())
    view = server_view(ScrapeResult(snapshot, None), ScrapeResult(snapshot, None))
    assert view["scraped"] is True
    assert (view["batch_size"], view["queue_wait"], view["queue_depth"], view["cache"]) == (None, None, None, None)


def test_series_are_matched_by_name_whatever_the_declared_type() -> None:
    text = (
        "# TYPE mmserve_stage_latency_seconds untyped\n"
        'mmserve_stage_latency_seconds{route="text",stage="queue",quantile="0.9"} 0.25\n'
        "# TYPE mmserve_stage_latency_seconds_count gauge\n"
        'mmserve_stage_latency_seconds_count{route="text",stage="queue"} 4\n'
        "# TYPE mmserve_stage_latency_seconds_sum gauge\n"
        'mmserve_stage_latency_seconds_sum{route="text",stage="queue"} 0.5\n'
    )
    after = parse_metrics_text(text)
    view = server_view(ScrapeResult(parse_metrics_text(""), None), ScrapeResult(after, None))
    assert view["queue_wait"]["text"]["mean_ms"] == pytest.approx(0.5 / 4 * 1000.0)
    assert view["queue_wait"]["text"]["quantiles_ms"] == {"0.9": pytest.approx(250.0)}


def _scrape_with(handler: httpx.MockTransport) -> ScrapeResult:
    async def go() -> ScrapeResult:
        async with httpx.AsyncClient(base_url="http://server", transport=handler) as client:
            return await scrape(client, timeout_s=1.0)

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("handler", "problem"),
    [
        (httpx.MockTransport(lambda request: httpx.Response(404, text="not found")), "HTTP 404"),
        (httpx.MockTransport(lambda request: httpx.Response(200, text="mmserve_x{{{ 1\n")), "unparseable"),
    ],
    ids=["404", "garbage"],
)
def test_a_failed_scrape_is_reported_not_raised(handler: httpx.MockTransport, problem: str) -> None:
    result = _scrape_with(handler)
    assert result.snapshot is None and result.error is not None and problem in result.error
    view = server_view(result, result)
    assert view["scraped"] is False and len(view["errors"]) == 2
    assert (view["batch_size"], view["queue_wait"], view["queue_depth"], view["cache"]) == (None, None, None, None)


def test_an_unreachable_server_is_reported_not_raised() -> None:
    result = _scrape_with(httpx.MockTransport(_refuse))
    assert result.snapshot is None and "ConnectError" in (result.error or "")


def _refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def test_scrape_over_http_reads_the_stand_in_registry(standin) -> None:
    before = _scrape_real(standin.url)
    body = {"text": "a photo", "image": {"b64": "aGVsbG8="}}
    with httpx.Client(base_url=standin.url) as client:
        for _ in range(3):
            assert client.post("/v1/infer", json=body).status_code == 200
    after = _scrape_real(standin.url)
    view = server_view(before, after)
    assert view["scraped"] is True
    assert view["batch_size"]["fusion"]["num_batches"] == 3
    assert view["batch_size"]["fusion"]["mean"] == pytest.approx(sum(standin.state.batch_sizes_by_lane["fusion"]) / 3)
    # The same image three times: the stand-in counted one miss, then hits.
    hits, misses = standin.state.cache_events[("image", "hit")], standin.state.cache_events[("image", "miss")]
    assert (hits, misses) == (2, 1)
    assert view["cache"]["by_modality"]["image"]["hit_ratio"] == pytest.approx(hits / (hits + misses))
    assert view["cache"]["by_modality"]["text"]["hit_ratio"] == 0.0


def _scrape_real(url: str) -> ScrapeResult:
    async def go() -> ScrapeResult:
        async with httpx.AsyncClient(base_url=url) as client:
            return await scrape(client, timeout_s=5.0)

    return asyncio.run(go())
