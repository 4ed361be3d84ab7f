"""Traces against a live server: span structure and links, the parent a traceparent names, sampling,
the real OTLP exporters against a receiver that decodes the wire, and exemplars on /metrics."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from encoded_images import encoded_image_b64
from otlp_receiver import otlp_grpc_receiver, otlp_receiver
from server.settings import Settings

TEXT = "a secret caption that must never reach a span"
PARENT_TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT_SPAN_ID = 0x00F067AA0BA902B7
SAMPLED_PARENT = f"00-{PARENT_TRACE_ID:032x}-{PARENT_SPAN_ID:016x}-01"
UNSAMPLED_PARENT = f"00-{PARENT_TRACE_ID:032x}-{PARENT_SPAN_ID:016x}-00"
STAGES = {"decode", "queue", "vision", "text", "fusion", "respond"}


def fusion_body(**options: object) -> dict:
    return {"text": TEXT, "image": {"b64": encoded_image_b64(3, (40, 30), "PNG")}, "use_cache": False, **options}


@pytest.fixture
def traced_server(live_server_runner, tiny_bundle):
    """A tiny server tracing every request into an in-memory exporter: (server, exporter)."""
    exporter = InMemorySpanExporter()
    settings = Settings(preset="tiny", device="cpu", trace_sample_ratio=1.0, trace_slow_ms=0,
                        enable_fault_injection=True)
    with live_server_runner(settings, tiny_bundle, span_exporter=exporter) as server:
        yield server, exporter


def spans_of_trace(exporter: InMemorySpanExporter, trace_id: int) -> list:
    return [span for span in exporter.get_finished_spans() if span.context.trace_id == trace_id]


def batch_spans(exporter: InMemorySpanExporter) -> list:
    return [span for span in exporter.get_finished_spans() if span.name.startswith("batch ")]


def assert_no_content(spans, text: str = TEXT) -> None:
    for span in spans:
        for value in dict(span.attributes).values():
            values = value if isinstance(value, tuple) else (value,)
            assert not any(isinstance(v, str) and (text in v or v in text and len(v) > 8) for v in values), value
        assert text not in span.name


def test_a_fusion_request_gives_a_server_span_under_the_callers_span_with_its_stages(traced_server):
    server, exporter = traced_server
    with server.client() as client:
        answer = client.post("/v1/infer", json=fusion_body(priority="high", timeout_ms=20_000),
                             headers={"traceparent": SAMPLED_PARENT, "tracestate": "vendor=abc"})
    assert answer.status_code == 200
    spans = spans_of_trace(exporter, PARENT_TRACE_ID)
    (root,) = [span for span in spans if span.kind == SpanKind.SERVER]
    assert root.name == "POST /v1/infer"
    assert root.parent.span_id == PARENT_SPAN_ID and root.parent.is_remote
    assert root.context.trace_state.get("vendor") == "abc"
    assert answer.headers["traceparent"] == f"00-{PARENT_TRACE_ID:032x}-{root.context.span_id:016x}-01"
    attributes = dict(root.attributes)
    assert attributes["http.route"] == "/v1/infer" and attributes["http.response.status_code"] == 200
    assert attributes["mmserve.route"] == "fusion" and attributes["mmserve.priority"] == "high"
    assert attributes["mmserve.deadline_ms"] == 20_000 and attributes["mmserve.image.count"] == 1
    assert attributes["mmserve.image.encodings"] == ("png",)
    assert attributes["mmserve.text.tokens"] == answer.json()["text"]["num_tokens"]
    assert attributes["mmserve.cache.image"] == "bypass" and attributes["mmserve.cache.text"] == "bypass"
    assert attributes["mmserve.model.fingerprint"] == answer.json()["model"]["fingerprint"]
    children = {span.name: span for span in spans if span.parent is not None and span.parent.span_id == root.context.span_id}
    assert set(children) == STAGES
    timings_ms = answer.json()["timings_ms"]
    for stage, span in children.items():  # one clock: each stage span lasts what timings_ms says
        assert round((span.end_time - span.start_time) / 1e6, 3) == timings_ms[stage], stage
        assert root.start_time <= span.start_time <= span.end_time <= root.end_time, stage
    assert children["decode"].end_time <= children["queue"].start_time
    assert children["queue"].end_time == children["vision"].start_time <= children["text"].start_time
    assert children["fusion"].end_time <= children["respond"].start_time
    assert_no_content(spans + batch_spans(exporter))


def test_the_batch_span_and_its_requests_link_to_each_other(traced_server):
    server, exporter = traced_server
    with server.client() as client:
        answer = client.post("/v1/infer", json=fusion_body())
    trace_id = int(answer.headers["traceparent"].split("-")[1], 16)
    (root,) = [span for span in spans_of_trace(exporter, trace_id) if span.kind == SpanKind.SERVER]
    (link,) = root.links
    (batch,) = [span for span in batch_spans(exporter) if span.context.span_id == link.context.span_id]
    assert batch.context.trace_id == link.context.trace_id != trace_id  # a batch is its own trace
    assert root.context.span_id in {link.context.span_id for link in batch.links}
    attributes = dict(batch.attributes)
    assert attributes["mmserve.lane"] == "fusion" and attributes["mmserve.device"] == "cpu"
    assert attributes["mmserve.batch.size"] == 1 and attributes["mmserve.batch.image_shape"][1:] == (32, 32, 3)
    assert attributes["mmserve.batch.text_shape"][0] == 1
    assert batch.end_time - batch.start_time >= sum(
        round(answer.json()["timings_ms"][stage] * 1e6) - 1000 for stage in ("vision", "text", "fusion"))


def test_v2_and_openai_requests_trace_one_span_per_row_under_the_callers_span(traced_server):
    server, exporter = traced_server
    v2_body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": [TEXT, "another one"]}]}
    with server.client() as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        v2 = client.post(f"/v2/models/{model}/infer", json=v2_body, headers={"traceparent": SAMPLED_PARENT})
        openai = client.post("/v1/embeddings", json={"input": [TEXT], "model": model},
                             headers={"traceparent": SAMPLED_PARENT})
    assert v2.status_code == 200 and openai.status_code == 200, (v2.text, openai.text)
    spans = spans_of_trace(exporter, PARENT_TRACE_ID)
    roots = {span.name: span for span in spans if span.kind == SpanKind.SERVER}
    assert set(roots) == {"POST /v2/models/{model_name}/infer", "POST /v1/embeddings"}
    for name, num_rows in (("POST /v2/models/{model_name}/infer", 2), ("POST /v1/embeddings", 1)):
        root = roots[name]
        assert root.parent.span_id == PARENT_SPAN_ID and dict(root.attributes)["mmserve.rows"] == num_rows
        rows = [span for span in spans if span.name == "row" and span.parent.span_id == root.context.span_id]
        assert sorted(dict(row.attributes)["mmserve.row"] for row in rows) == list(range(num_rows))
        for row in rows:
            stages = {span.name for span in spans if span.parent is not None
                      and span.parent.span_id == row.context.span_id}
            computed = {"text"} if dict(row.attributes)["mmserve.cache.text"] != "hit" else set()
            assert stages == {"decode", "queue"} | computed
        assert root.links and all(link.context.trace_id != PARENT_TRACE_ID for link in root.links)
    assert_no_content(spans)


def test_sampling_keeps_errors_and_honours_the_parents_flag(live_server_runner, tiny_bundle):
    exporter = InMemorySpanExporter()
    settings = Settings(preset="tiny", device="cpu", trace_sample_ratio=0.0, trace_slow_ms=0,
                        enable_fault_injection=True)
    with live_server_runner(settings, tiny_bundle, span_exporter=exporter) as server, server.client() as client:
        dropped = client.post("/v1/infer", json={"text": TEXT})
        not_sampled = client.post("/v1/infer", json={"text": TEXT}, headers={"traceparent": UNSAMPLED_PARENT})
        bad_client = client.post("/v1/infer", json={"text": ""})
        assert not exporter.get_finished_spans()
        assert dropped.headers["traceparent"].endswith("-00") and bad_client.status_code == 422
        assert not_sampled.headers["traceparent"].startswith(f"00-{PARENT_TRACE_ID:032x}-")
        sampled = client.post("/v1/infer", json={"text": TEXT}, headers={"traceparent": SAMPLED_PARENT})
        assert sampled.headers["traceparent"].endswith("-01") and spans_of_trace(exporter, PARENT_TRACE_ID)
        client.post("/v1/admin/faults", json={"stage": "decode", "delay_ms": 30})
        late = client.post("/v1/infer", json={"text": TEXT, "timeout_ms": 5})
    assert late.status_code == 504, late.text
    trace_id = int(late.headers["traceparent"].split("-")[1], 16)
    (root,) = [span for span in spans_of_trace(exporter, trace_id) if span.kind == SpanKind.SERVER]
    assert dict(root.attributes)["mmserve.error.code"] == "deadline_exceeded"
    assert dict(root.attributes)["error.type"] == "504" and not root.status.is_ok


def test_tracing_off_by_default_adds_no_header(tiny_server):
    with tiny_server.client() as client:
        answer = client.post("/v1/infer", json={"text": TEXT})
    assert answer.status_code == 200 and "traceparent" not in answer.headers
    assert tiny_server.app.state.mmserve.tracer is None


def test_exemplars_carry_kept_trace_ids_in_openmetrics_only(traced_server):
    server, _ = traced_server
    with server.client() as client:
        answer = client.post("/v1/infer", json={"text": TEXT})
        plain = client.get("/metrics")
        open_metrics = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    trace_id = answer.headers["traceparent"].split("-")[1]
    assert plain.headers["content-type"].startswith("text/plain") and "trace_id" not in plain.text
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
    exemplars = [sample.exemplar for family in text_string_to_metric_families(open_metrics.text)
                 if family.name == "mmserve_request_duration_seconds" for sample in family.samples
                 if sample.exemplar is not None and sample.labels.get("route") == "text"]
    assert trace_id in {exemplar.labels["trace_id"] for exemplar in exemplars}


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_the_otlp_exporter_sends_decodable_spans_to_a_receiver(protocol, live_server_runner, tiny_bundle,
                                                              monkeypatch):
    receiver_of = otlp_receiver if protocol == "http/protobuf" else otlp_grpc_receiver
    with receiver_of() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.traces_url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "mmserve-under-test")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        settings = Settings(preset="tiny", device="cpu", trace_sample_ratio=0.0)  # tracing=auto: the endpoint
        with live_server_runner(settings, tiny_bundle) as server, server.client() as client:
            answer = client.post("/v1/infer", json=fusion_body(), headers={"traceparent": SAMPLED_PARENT})
            server_span_id = int(answer.headers["traceparent"].split("-")[2], 16)
            spans = receiver.wait_for_spans(lambda spans: {s.name for s in spans} >= STAGES | {"batch fusion"})
    assert answer.status_code == 200
    by_name = {span.name: span for span in spans}
    root = by_name["POST /v1/infer"]
    assert root.resource["service.name"] == "mmserve-under-test"
    assert int.from_bytes(root.span.trace_id, "big") == PARENT_TRACE_ID
    assert int.from_bytes(root.span.parent_span_id, "big") == PARENT_SPAN_ID
    assert int.from_bytes(root.span.span_id, "big") == server_span_id
    for stage in STAGES:
        assert by_name[stage].span.parent_span_id == root.span.span_id, stage
    batch = by_name["batch fusion"]
    assert [link.span_id for link in root.span.links] == [batch.span.span_id]
    assert root.span.span_id in [link.span_id for link in batch.span.links]
    assert root.attributes["mmserve.route"] == "fusion" and batch.attributes["mmserve.batch.size"] == 1
    wire = json.dumps([{**span.attributes, "name": span.name} for span in spans])
    assert TEXT not in wire and "secret" not in wire


def test_fastapis_own_telemetry_stays_off_when_the_process_has_a_global_tracer_provider(
        tiny_server, monkeypatch):
    """mmserve's spans go through its own tracer; FastAPI's native OpenTelemetry would add a second server
    span per request to a globally configured provider (``opentelemetry-instrument``, a host's SDK set-up),
    outside mmserve's sampling and trace, and ask for that provider on every request even when none is set."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    with tiny_server.client() as client:
        assert client.post("/v1/embeddings", json={"input": "a caption", "model": "tiny"}).status_code == 200
        assert client.get("/health/ready").status_code == 200
    assert exporter.get_finished_spans() == ()


def test_a_grpc_call_traces_under_the_traceparent_of_its_metadata(live_server_runner, tiny_bundle):
    import socket

    import numpy as np
    import tritonclient.grpc as triton_grpc

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    exporter = InMemorySpanExporter()
    settings = Settings(preset="tiny", device="cpu", trace_sample_ratio=1.0, trace_slow_ms=0, grpc_port=port)
    with live_server_runner(settings, tiny_bundle, span_exporter=exporter), \
            triton_grpc.InferenceServerClient(f"127.0.0.1:{port}") as client:
        text = triton_grpc.InferInput("text", [2], "BYTES")
        text.set_data_from_numpy(np.array([TEXT.encode(), b"another one"], dtype=object))
        client.infer("tiny", [text], headers={"traceparent": SAMPLED_PARENT})
    spans = spans_of_trace(exporter, PARENT_TRACE_ID)
    (root,) = [span for span in spans if span.kind == SpanKind.SERVER]
    assert root.name == "POST /inference.GRPCInferenceService/ModelInfer"
    assert root.parent.span_id == PARENT_SPAN_ID and dict(root.attributes)["mmserve.rows"] == 2
    rows = [span for span in spans if span.name == "row" and span.parent.span_id == root.context.span_id]
    assert sorted(dict(row.attributes)["mmserve.row"] for row in rows) == [0, 1]
    assert_no_content(spans)
