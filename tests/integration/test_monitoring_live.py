"""Stage timings into the latency monitor on a live server, and the /v1/monitoring/* documents.

Every answered ``/v1/infer`` request's ``timings_ms`` are the very numbers
the monitor records, so the client can check the digests against what it was
told: sample counts per (route, stage), sums, and extremes.
"""

from __future__ import annotations

import base64
import math
import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitoring import SUMMARY_QUANTILES

QUANTILE_LABELS = {str(q) for q in SUMMARY_QUANTILES}
STAGES = {
    "text": {"decode", "queue", "text", "respond", "total"},
    "vision": {"decode", "queue", "vision", "respond", "total"},
    "fusion": {"decode", "queue", "vision", "text", "fusion", "respond", "total"},
}


def image_body(seed: int, text: str | None = None) -> dict:
    pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    body: dict = {"image": {"uint8": {"shape": [32, 32, 3], "b64": base64.b64encode(pixels.tobytes()).decode()}}}
    if text is not None:
        body["text"] = text
    return body


def series_by_key(document: dict) -> dict[tuple[str, str], dict]:
    return {(entry["route"], entry["stage"]): entry for entry in document["series"]}


def lifetime_counts(client: httpx.Client) -> dict[tuple[str, str], int]:
    document = client.get("/v1/monitoring/digests").json()
    return {key: entry["lifetime"]["n_values"] for key, entry in series_by_key(document).items()}


def wait_for_counts(client: httpx.Client, expected: dict[tuple[str, str], int], timeout_s: float = 10.0) -> dict:
    """The digests document once the background fold has taken in every expected sample."""
    deadline = time.monotonic() + timeout_s
    while True:
        document = client.get("/v1/monitoring/digests").json()
        counts = {key: entry["lifetime"]["n_values"] for key, entry in series_by_key(document).items()}
        if all(counts.get(key, 0) >= n for key, n in expected.items()) or time.monotonic() > deadline:
            return document
        time.sleep(0.1)


def scrape(client: httpx.Client) -> dict[tuple[str, tuple], float]:
    samples = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_each_answered_request_records_exactly_its_timings(live_server_factory):
    timings: dict[str, list[dict[str, float]]] = {"text": [], "vision": [], "fusion": []}
    with live_server_factory() as server, server.client() as client:
        for i in range(6):
            for route, body in (("text", {"text": f"a sentence number {i}"}), ("vision", image_body(i)),
                                ("fusion", image_body(100 + i, f"what is in picture {i}?"))):
                answer = client.post("/v1/infer", json=body)
                assert answer.status_code == 200, answer.text
                assert answer.json()["route"] == route
                timings[route].append(answer.json()["timings_ms"])
        expected = {(route, stage): len(rows) for route, rows in timings.items() for stage in STAGES[route]}
        document = wait_for_counts(client, expected)
        metrics = scrape(client)
    series = series_by_key(document)
    assert document["format"] == "mmserve.digests/1"
    assert set(series) == set(expected), "every stage a request ran, and no other, is recorded"
    for (route, stage), entry in series.items():
        observed_s = np.array([row[stage] for row in timings[route]]) / 1e3
        lifetime, window = entry["lifetime"], entry["window"]
        assert lifetime["n_values"] == window["n_values"] == len(observed_s)
        # timings_ms is rounded to 1 us; the digests hold the nanosecond values.
        assert lifetime["sum"] == pytest.approx(observed_s.sum(), abs=len(observed_s) * 0.6e-6)
        assert lifetime["min"] == pytest.approx(observed_s.min(), abs=0.6e-6)
        assert lifetime["max"] == pytest.approx(observed_s.max(), abs=0.6e-6)
        labels = (("route", route), ("stage", stage))
        assert metrics[("mmserve_stage_latency_seconds_count", labels)] == len(observed_s)
        assert metrics[("mmserve_stage_latency_seconds_sum", labels)] == pytest.approx(lifetime["sum"])
        quantiles = [metrics[("mmserve_stage_latency_seconds", tuple(sorted((*labels, ("quantile", q)))))]
                     for q in sorted(QUANTILE_LABELS, key=float)]
        assert quantiles == sorted(quantiles)
        assert observed_s.min() - 1e-6 <= quantiles[0] and quantiles[-1] <= observed_s.max() + 1e-6
    for route in STAGES:
        assert metrics[("mmserve_drift_active", (("route", route),))] == 0.0
        # Six requests cannot fill a baseline of drift_min_samples (5000): the route still learns.
        labels = (("route", route),)
        assert metrics[("mmserve_drift_baseline_frozen", labels)] == 0.0
        assert metrics[("mmserve_drift_baseline_min_samples", labels)] == 5000.0
        assert 0.0 <= metrics[("mmserve_drift_baseline_samples", labels)] <= len(timings[route])


def test_errors_and_protocol_rows(live_server_factory):
    with live_server_factory() as server, server.client() as client:
        assert client.post("/v1/infer", json={"text": "one answered request"}).status_code == 200
        wait_for_counts(client, {("text", "total"): 1})
        before = lifetime_counts(client)
        assert client.post("/v1/infer", json={"text": ""}).status_code == 422
        assert client.post("/v1/infer", content=b"not json", headers={"content-type": "text/plain"}).status_code == 415
        rows = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": ["one", "two", "three"]}]}
        assert client.post("/v2/models/tiny/infer", json=rows).status_code == 200
        after = wait_for_counts(client, {("text", "queue"): before[("text", "queue")] + 3})
    counts = {key: entry["lifetime"]["n_values"] for key, entry in series_by_key(after).items()}
    assert not any(route == "invalid" for route, _ in counts), "refused requests are not recorded"
    # Each row adds its own queue and compute stages; decode and total stay per /v1/infer request.
    assert counts[("text", "queue")] == before[("text", "queue")] + 3
    assert counts[("text", "text")] == before[("text", "text")] + 3
    for stage in ("decode", "respond", "total"):
        assert counts[("text", stage)] == before[("text", stage)], stage


def test_a_stage_delay_is_timed_inside_that_stage(live_server_factory):
    with live_server_factory(enable_fault_injection=True, max_batch_size=1) as server, server.client() as client:
        fault = {"stage": "vision", "delay_ms": 172, "fraction": 0.2, "duration_s": 60}
        assert client.post("/v1/admin/faults", json=fault).status_code == 200
        answers = []
        for i in range(40):
            answer = client.post("/v1/infer", json=image_body(i))
            assert answer.status_code == 200
            answers.append(answer.json()["timings_ms"])
        client.delete("/v1/admin/faults")
        document = wait_for_counts(client, {("vision", "vision"): 40})
    delayed = [row for row in answers if row["vision"] >= 172]
    assert 1 <= len(delayed) < 40, "about a fifth of the batches are delayed"
    assert all(row["total"] >= row["vision"] and row["queue"] < 172 for row in delayed)
    vision = series_by_key(document)[("vision", "vision")]["window"]
    # The digest holds every sample as its own centroid at this size: the delayed mass is the delayed count.
    delayed_weight = sum(weight for mean, weight in vision["centroids"] if mean >= 0.172)
    assert delayed_weight == len(delayed)
    assert vision["max"] >= 0.172
    decode = series_by_key(document)[("vision", "decode")]["window"]
    assert decode["max"] < 0.172, "the delay lands in vision only"


def test_drift_document_follows_the_settings_and_baseline_can_be_relearned(live_server_factory):
    settings = dict(drift_window_s=60.0, drift_baseline_s=300.0, drift_period_s=15.0, drift_threshold=0.05,
                    drift_consecutive=4, drift_min_samples=1000, drift_tail_ratio=2.0)
    with live_server_factory(**settings) as server, server.client() as client:
        assert client.post("/v1/infer", json={"text": "start a route"}).status_code == 200
        wait_for_counts(client, {("text", "total"): 1})
        first = client.get("/v1/monitoring/drift").json()
        relearned = client.post("/v1/monitoring/baseline")
        second = client.get("/v1/monitoring/drift").json()
    assert first["rule"] == {"threshold": 0.05, "consecutive": 4, "min_samples": 1000, "ks_alpha": 1e-3,
                             "tail_ratio": 2.0, "tail_quantiles": [0.999, 0.9999], "window_s": 60.0,
                             "period_s": 15.0}
    baseline = first["baseline"]
    assert baseline["phase"] == "learning", "the baseline starts once the server is ready"
    assert baseline["baseline_s"] == 300.0 and 0 <= baseline["learned_s"] < 300.0
    assert baseline["started_unix_s"] <= first["generated_unix_s"]
    text = first["routes"]["text"]
    assert text["state"] == "learning_baseline" and text["active"] is False
    assert text["attributed_stage"] is None and text["ks"] == {}
    assert text["since_unix_s"] <= first["generated_unix_s"] and math.isfinite(text["for_s"])
    assert relearned.status_code == 200
    assert relearned.json()["baseline"]["phase"] == "learning"
    assert relearned.json()["baseline"]["started_unix_s"] >= baseline["started_unix_s"]
    assert second["baseline"]["started_unix_s"] == relearned.json()["baseline"]["started_unix_s"]


def test_a_bad_drill_is_refused_in_the_servers_error_shape_as_with_api_processes_in_front(live_server_factory):
    """One process has one engine, 0: ``?engine=N`` is checked as API processes check it before they forward
    (tests/integration/test_engines.py), so a number naming no engine is 422 ``invalid_engine`` whatever N, not a
    drill set on engine 0 or FastAPI's own ``detail`` body; ``?engine=0`` sets it, and killing still answers 409.
    A body that is not JSON, or not a drill, is answered as every route answers one: ``{"error": {code, message,
    field}}``, 400 ``invalid_json`` and 422 ``invalid_request`` naming the field (the same body, forwarded, is
    answered by an engine's copy of this route)."""
    fault = {"stage": "vision", "delay_ms": 1, "duration_s": 60}
    with live_server_factory(enable_fault_injection=True) as server, server.client() as client:
        refused = [client.post("/v1/admin/faults?engine=1", json=fault),
                   client.post("/v1/admin/faults?engine=x", json=fault),
                   client.get("/v1/admin/faults?engine=7"), client.delete("/v1/admin/faults?engine=-1"),
                   client.post("/v1/admin/faults/kill"), client.post("/v1/admin/faults/kill?engine=x")]
        malformed = client.post("/v1/admin/faults", content=b"{bad", headers={"content-type": "application/json"})
        invalid = [client.post("/v1/admin/faults", json={"stage": "vision", "delay_ms": -1}),
                   client.post("/v1/admin/faults", json={"delay_ms": 5}), client.post("/v1/admin/faults", json=[1])]
        listed = client.get("/v1/admin/faults").json()["active"]
        on_zero = client.post("/v1/admin/faults?engine=0", json=fault)
        kill_zero = client.post("/v1/admin/faults/kill?engine=0")
        client.delete("/v1/admin/faults")
    assert [(answer.status_code, answer.json()["error"]["code"], answer.json()["error"]["field"])
            for answer in refused] == [(422, "invalid_engine", "engine")] * len(refused)
    assert (malformed.status_code, malformed.json()["error"]["code"]) == (400, "invalid_json"), malformed.text
    assert [(answer.status_code, answer.json()["error"]["code"], answer.json()["error"]["field"])
            for answer in invalid] == [(422, "invalid_request", "delay_ms"), (422, "invalid_request", "stage"),
                                       (422, "invalid_request", "body")]
    assert listed == [], "a refused drill is not set"
    assert on_zero.status_code == 200 and [plan["engine"] for plan in on_zero.json()["active"]] == [0]
    assert kill_zero.status_code == 409 and kill_zero.json()["error"]["code"] == "not_an_engine"
