"""Settings -> MonitorConfig, readiness -> baseline, cache statuses -> cache_hit, and the 409 before readiness."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError

from monitoring import BaselinePhase, InvalidMonitorConfigError, ManualClock, Monitor, MonitorConfig
from server.errors import ApiError
from server.runtime.monitoring_setup import cache_hit_of, mark_ready_when_ready, monitor_config
from server.routes import monitoring as monitoring_routes
from server.settings import Settings


def test_drift_settings_come_from_the_environment_into_the_monitor_config(monkeypatch: pytest.MonkeyPatch):
    for name, value in {"WINDOW_S": "6", "BASELINE_S": "12", "PERIOD_S": "1.5", "THRESHOLD": "0.1",
                        "CONSECUTIVE": "5", "MIN_SAMPLES": "200", "TAIL_RATIO": "3"}.items():
        monkeypatch.setenv(f"MMSERVE_DRIFT_{name}", value)
    config = monitor_config(Settings())
    assert (config.window_s, config.baseline_s, config.period_s) == (6.0, 12.0, 1.5)
    assert (config.threshold, config.consecutive, config.min_samples, config.tail_ratio) == (0.1, 5, 200, 3.0)
    assert config.fold_interval_s == pytest.approx(6.0 / config.num_sub_windows), "a short window folds faster"


def test_the_defaults_are_the_monitor_packages_defaults():
    config, package = monitor_config(Settings()), MonitorConfig()
    for name in ("window_s", "baseline_s", "period_s", "threshold", "consecutive", "min_samples", "tail_ratio",
                 "num_sub_windows", "fold_interval_s"):
        assert getattr(config, name) == getattr(package, name), name


def test_contradicting_or_out_of_range_drift_settings_are_refused():
    with pytest.raises(InvalidMonitorConfigError, match="baseline_s"):
        monitor_config(Settings(drift_window_s=120.0, drift_baseline_s=1.0))
    for bad in ({"drift_threshold": 1.0}, {"drift_consecutive": 0}, {"drift_tail_ratio": 1.0},
                {"drift_window_s": 0}):
        with pytest.raises(ValidationError):
            Settings(**bad)


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ({"image": "hit", "text": "hit"}, True),
        ({"image": "hit", "text": "miss"}, False),
        ({"image": "coalesced"}, False),
        ({"image": "bypass", "text": "hit"}, True),
        ({"image": "bypass", "text": "bypass"}, None),
        ({}, None),
    ],
)
def test_cache_hit_means_every_asked_segment_was_a_hit(statuses, expected):
    assert cache_hit_of(statuses) is expected


def test_the_baseline_starts_once_the_router_is_ready():
    monitor = Monitor(MonitorConfig(), clock=ManualClock())
    polls = []

    def is_ready() -> bool:
        polls.append(monitor.baseline_phase)
        return len(polls) >= 3

    asyncio.run(mark_ready_when_ready(monitor, is_ready, poll_interval_s=0))
    assert polls == [BaselinePhase.NOT_READY] * 3
    assert monitor.baseline_phase is BaselinePhase.LEARNING


def test_relearning_before_readiness_is_a_409_and_after_it_restarts_learning():
    monitor = Monitor(MonitorConfig(), clock=ManualClock())
    app = FastAPI()
    app.add_exception_handler(ApiError, lambda request, error: error.response())
    app.include_router(monitoring_routes.router)
    app.state.mmserve = SimpleNamespace(monitor=monitor, router=SimpleNamespace(is_ready=False))
    with TestClient(app) as client:
        refused = client.post("/v1/monitoring/baseline")
        monitor.mark_ready()
        accepted = client.post("/v1/monitoring/baseline")
        drift = client.get("/v1/monitoring/drift")
        digests = client.get("/v1/monitoring/digests")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_ready"
    assert accepted.status_code == 200 and accepted.json()["baseline"]["phase"] == "learning"
    assert drift.json()["routes"] == {} and drift.json()["baseline"]["phase"] == "learning"
    assert digests.json()["format"] == "mmserve.digests/1" and digests.json()["series"] == []


def test_relearning_once_the_router_is_ready_is_accepted_before_the_readiness_poll_marks_the_monitor():
    """/health/ready follows the router; the monitor is marked on the lifespan's next poll of it. Between the
    two, a caller who saw /health/ready answer 200 was told 409 "retry once /health/ready answers 200"."""
    monitor = Monitor(MonitorConfig(), clock=ManualClock())
    app = FastAPI()
    app.add_exception_handler(ApiError, lambda request, error: error.response())
    app.include_router(monitoring_routes.router)
    app.state.mmserve = SimpleNamespace(monitor=monitor, router=SimpleNamespace(is_ready=True))
    assert monitor.baseline_phase is BaselinePhase.NOT_READY  # the poll has not run
    with TestClient(app) as client:
        accepted = client.post("/v1/monitoring/baseline")
    assert accepted.status_code == 200 and accepted.json()["baseline"]["phase"] == "learning"
    assert monitor.baseline_phase is BaselinePhase.LEARNING


def test_request_inputs_say_what_the_request_carried():
    from encoded_images import encoded_image
    from models.tokenizer import TokenizedText
    from router.item_facts import ItemFacts
    from router.segments import ImageContent
    from server.runtime.monitoring_setup import request_inputs

    wide_png = ImageContent(encoded=encoded_image(0, (3840, 80), "PNG"))  # 307 200 pixels: the largest counts
    small_png = ImageContent(encoded=encoded_image(1, (40, 30), "PNG"))
    sent = ItemFacts.of_images((small_png, wide_png), protocol="native", priority="high")
    facts = sent.with_text(TokenizedText(tuple(range(20)), False, 20), None)
    assert request_inputs(facts).labels() == {"image_pixels": "0.25-1MP", "image_encoding": "png",
                                              "text_tokens": "17-64", "images": "2", "priority": "high",
                                              "protocol": "native", "engine": "0"}

    raw = ImageContent(pixels=bytes(2160 * 3840 * 3), shape=(2160, 3840, 3))
    facts = ItemFacts.of_images((raw,), protocol="kserve_v2", priority="normal").with_text(None, None)
    facts = dataclasses.replace(facts, engine=1)  # computed by engine 1 (server.workers.engine_client)
    assert request_inputs(facts).labels() == {"image_pixels": "4-16MP", "image_encoding": "raw_uint8",
                                              "text_tokens": "none", "images": "1", "priority": "normal",
                                              "protocol": "kserve_v2", "engine": "1"}
