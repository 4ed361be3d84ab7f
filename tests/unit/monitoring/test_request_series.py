"""``ServingMetrics.request_series``: the request counter and histogram of a (route, code), labelled once."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from monitoring.serving_metrics import ServingMetrics


def test_request_series_counts_into_the_labelled_series_and_reuses_them():
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry)
    counter, histogram = metrics.request_series("openai", "200")
    assert metrics.request_series("openai", "200") == (counter, histogram)  # the same children, not looked up again
    counter.inc()
    histogram.observe(0.004)
    other_counter, other_histogram = metrics.request_series("openai", "503")
    other_counter.inc()
    assert other_histogram is histogram  # the duration is per route only
    value = registry.get_sample_value
    assert value("mmserve_requests_total", {"route": "openai", "code": "200"}) == 1
    assert value("mmserve_requests_total", {"route": "openai", "code": "503"}) == 1
    assert value("mmserve_request_duration_seconds_count", {"route": "openai"}) == 1
    metrics.requests_total.labels(route="openai", code="200").inc()  # labelled directly, as app.py does
    assert value("mmserve_requests_total", {"route": "openai", "code": "200"}) == 2
