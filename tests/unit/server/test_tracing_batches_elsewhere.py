"""A batch span exported by another process's tracer (``--api-workers N``): sent once, exported once.

An API process keeps or drops its requests' traces and exports their spans;
the batches those requests ran in go to the engine's tracer, which exports
each batch span the first time any API process sends it.
"""

from __future__ import annotations

import time

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from router.intake import IntakeOutcome
from router.request import InferenceResult, Route
from router.tracing import BatchTrace, SpanIds
from server.http.tail_sampling import TailSampler
from server.http.traced_answer import TracedAnswer, TracedItem
from server.http.tracing import RequestTracer
from server.ingest.inputs import ParsedInput

TIMEOUTS_MS = {"text": 1000, "vision": 1000, "fusion": 1000}


def tracer(exporter: InMemorySpanExporter, **options: object) -> RequestTracer:
    return RequestTracer(SimpleSpanProcessor(exporter), Resource({}), TailSampler(1.0, 0), model_name="tiny",
                         model_fingerprint="ab12", default_timeout_ms=TIMEOUTS_MS, **options)


def batch_serving(*requests: SpanIds, started_ns: int) -> BatchTrace:
    return BatchTrace(SpanIds(2**90 + 3, 77), Route.TEXT, "text", "cpu", num_requests=len(requests),
                      num_work_items=len(requests), padded_size=2, image_shape=(), text_shape=(2, 16),
                      started_ns=started_ns, elapsed_ns=2_000_000, stage_ns=(("text", 2_000_000),), links=requests)


def answered(batch: BatchTrace, arrived_ns: int) -> TracedAnswer:
    outcome = IntakeOutcome(InferenceResult(Route.TEXT, batch_size=batch.num_requests,
                                            stage_ns={"queue": 1_000_000, "text": 2_000_000}, batch_trace=batch),
                            None, plan=None, decode_ns=500_000, decode_started_ns=arrived_ns)  # type: ignore[arg-type]
    item = TracedItem(ParsedInput("hello", (), "normal", None, False), outcome=outcome)
    ended_ns = batch.started_ns + batch.elapsed_ns + 1_000_000
    return TracedAnswer("/v1/infer", "text", 200, ended_ns, items=(item,), respond=(ended_ns - 500_000, 400_000))


def test_the_api_side_sends_each_batch_once_and_exports_only_the_requests_spans():
    exporter, sent = InMemorySpanExporter(), []
    api = tracer(exporter, send_batches=sent.append)
    arrived_ns = time.perf_counter_ns()
    first, second = api.begin({}, arrived_ns), api.begin({}, arrived_ns)
    batch = batch_serving(first.ids, second.ids, started_ns=arrived_ns + 2_000_000)
    assert api.finish(first, answered(batch, arrived_ns)) and api.finish(second, answered(batch, arrived_ns))
    assert sent == [[batch]]  # the second request's batch was sent already
    spans = exporter.get_finished_spans()
    assert not [span for span in spans if span.name.startswith("batch")]
    servers = [span for span in spans if span.name == "POST /v1/infer"]
    assert [[link.context.span_id for link in server.links] for server in servers] == [[77], [77]]
    stages = {span.name for span in spans if span.parent is not None and span.parent.span_id == first.ids.span_id}
    assert stages == {"decode", "queue", "text", "respond"}


def test_the_engine_side_exports_a_batch_once_whichever_process_sent_it():
    exporter = InMemorySpanExporter()
    engine = tracer(exporter)
    requests = (SpanIds(11, 1), SpanIds(12, 2))
    started_ns = time.perf_counter_ns()
    batch = batch_serving(*requests, started_ns=started_ns)
    engine.emit_batches([batch])
    engine.emit_batches([batch])  # the other API process kept its request too
    (span,) = exporter.get_finished_spans()
    assert span.name == "batch text" and span.context.span_id == 77 and span.parent is None
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [(11, 1), (12, 2)]
    wall_start_ns = started_ns + time.time_ns() - time.perf_counter_ns()  # one machine-wide clock
    assert abs(span.start_time - wall_start_ns) < 50_000_000
    assert span.end_time - span.start_time == batch.elapsed_ns
