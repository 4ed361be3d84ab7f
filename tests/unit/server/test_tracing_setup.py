"""Tracing's set-up: on/off from the setting and the OTEL_* variables, the exporter's protocol, and no
OpenTelemetry SDK loaded at all while tracing is off."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest

from models.served_facts import served_model_facts
from server.runtime.tracing_setup import TracingSetupError, build_tracing, is_tracing_on
from server.settings import Settings

ENDPOINT = "http://127.0.0.1:4318"


@pytest.mark.parametrize(("tracing", "environ", "is_on"), [
    ("auto", {}, False),
    ("auto", {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, True),
    ("auto", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ENDPOINT}, True),
    ("auto", {"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ("auto", {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, False),
    ("auto", {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, False),
    ("off", {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, False),
    ("on", {}, True),
])
def test_on_or_off(tracing, environ, is_on):
    assert is_tracing_on(Settings(tracing=tracing), environ) is is_on


def test_off_builds_nothing(tiny_bundle):
    assert build_tracing(Settings(preset="tiny"), served_model_facts(tiny_bundle), {}) is None


@pytest.mark.parametrize(("protocol", "module"), [
    ("http/protobuf", "opentelemetry.exporter.otlp.proto.http.trace_exporter"),
    ("grpc", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"),
])
def test_the_protocol_picks_the_exporter(protocol, module, tiny_bundle, monkeypatch):
    importlib.import_module(module)  # the test extra installs both exporters
    monkeypatch.setenv("OTEL_SERVICE_NAME", "svc")
    tracing = build_tracing(Settings(preset="tiny", tracing="on"), served_model_facts(tiny_bundle),
                            {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol})
    try:
        assert type(tracing.processor.span_exporter).__module__ == module  # type: ignore[attr-defined]
        assert tracing.request_tracer._resource.attributes["service.name"] == "svc"
        assert tracing.batch_tracer.device == "cpu"
    finally:
        tracing.shutdown()


def test_the_service_is_named_mmserve_by_default(tiny_bundle, monkeypatch):
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    tracing = build_tracing(Settings(preset="tiny", tracing="on"), served_model_facts(tiny_bundle), {})
    try:
        assert tracing.request_tracer._resource.attributes["service.name"] == "mmserve"
    finally:
        tracing.shutdown()


def test_an_unknown_protocol_is_refused_by_name(tiny_bundle):
    with pytest.raises(TracingSetupError, match="http/json"):
        build_tracing(Settings(preset="tiny", tracing="on"), served_model_facts(tiny_bundle),
                      {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_tracing_off_loads_no_opentelemetry_sdk():
    """The app, every route and the router built and serving one request, with no SDK module imported."""
    script = textwrap.dedent("""
        import sys
        from fastapi.testclient import TestClient
        from models.loading.repository import build_preset
        from server.app import create_app
        from server.settings import Settings
        app = create_app(Settings(preset="tiny", device="cpu"), build_preset("tiny", seed=0))
        with TestClient(app) as client:
            answer = client.post("/v1/infer", json={"text": "hello"})
            assert answer.status_code == 200, answer.text
            assert "traceparent" not in answer.headers
        loaded = sorted(name for name in sys.modules if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")))
        assert not loaded, loaded
    """)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
