"""Request spans and batch spans, built when a request is answered from the stage times already measured.

    begin (arrival)   traceparent/tracestate -> the parent; new span ids for the server span
                      (passed down to the router, so a batch can link to them); one wall-clock
                      reading, anchored to the request's perf_counter_ns arrival
    finish (answer)   keep or drop (server.http.tail_sampling); if kept, emit:

      POST /v1/infer                          SERVER, parent = the client's span, links -> batch(es)
        ├─ decode  queue  vision  text  fusion  respond     (one item: children of the server span)
      POST /v2/models/{model_name}/infer      (many items: one "row" span each, stages under it)
        ├─ row 0 ─ decode queue text ...
        └─ respond
      batch text                              root of its own trace, links -> every request it served

Every span's start and end come from ``perf_counter_ns`` values the server
and router took anyway (converted to wall time with that one anchor), so a
stage span lasts exactly what ``timings_ms`` reports, and the server span
what ``mmserve_request_duration_seconds`` observed (the whole handler, the
answer's serialisation included). A batch span is emitted by the first kept
request it served, and only once.

With API processes in front of an engine (``--api-workers N``) the request's
spans are the API process's (its stage times come back in the engine's
outcome, on the same machine-wide monotonic clock), and so is the keep
decision; the batch span is the engine's, since a batch serves requests of
every API process and must be exported once: a kept request's batches go to
the engine (``send_batches``), whose tracer exports each the first time
(``emit_batches``) with its own exporter, to the same OTLP endpoint:

    API process   POST /v1/infer (+ stages)  --links-->  batch text  <--  engine process
                  send_batches([BatchTrace]) ------------------------->  emit_batches

Spans are handed straight to the span processor as finished ``ReadableSpan``s:
their ids were chosen at arrival and their times are measured, so nothing
here needs a live span or the context machinery. Only the set-up
(``server.runtime.tracing_setup``) imports this module, and only when
tracing is on.
"""

from __future__ import annotations

import collections
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from router.intake import IntakeOutcome
from router.tracing import BatchTrace, SpanIds
from server.http.tail_sampling import TailSampler
from server.http.trace_attributes import AttributeValue, batch_attributes, item_attributes
from server.http.traced_answer import TracedAnswer, TracedItem

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_COMPUTE_STAGES = ("vision", "text", "fusion")
_REMEMBERED_BATCHES = 4096  # batch spans already emitted (event loop only); far more than are in flight


@dataclass(frozen=True)
class RequestTrace:
    """One request's span ids, its parent (from ``traceparent``) and its clock anchor."""

    ids: SpanIds
    parent: SpanContext | None
    started_ns: int  # perf_counter_ns at arrival
    wall_offset_ns: int  # time_ns() - perf_counter_ns(), read once for this request

    @property
    def trace_id_hex(self) -> str:
        return f"{self.ids.trace_id:032x}"

    def traceparent(self, is_kept: bool) -> str:
        """The server span as a W3C ``traceparent``; the sampled flag says whether it was exported."""
        return f"00-{self.trace_id_hex}-{self.ids.span_id:016x}-{'01' if is_kept else '00'}"


class RequestTracer:
    """Starts (ids only) and finishes (spans) request traces; event loop only.

    Args:
        processor: Where finished spans go (a ``BatchSpanProcessor`` in front of the exporter).
        resource: The service's resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``).
        sampler: The keep-or-drop rule.
        model_name, model_fingerprint: On every server span.
        default_timeout_ms: Each route's deadline when a request sets none.
        send_batches: Where a kept request's batches go instead of this processor (an API
            process: to the engine, which exports each batch span once, ``emit_batches``).
    """

    def __init__(self, processor: SpanProcessor, resource: Resource, sampler: TailSampler, *,
                 model_name: str, model_fingerprint: str, default_timeout_ms: Mapping[str, int],
                 scope_version: str = "0.1.0",
                 send_batches: Callable[[Sequence[BatchTrace]], None] | None = None) -> None:
        self.processor = processor
        self.sampler = sampler
        self._resource = resource
        self._scope = InstrumentationScope("mmserve", scope_version)
        self._model = {"mmserve.model.name": model_name, "mmserve.model.fingerprint": model_fingerprint}
        self._default_timeout_ms = dict(default_timeout_ms)
        self._propagator = TraceContextTextMapPropagator()
        self._emitted_batches: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._send_batches = send_batches

    # -- arrival ------------------------------------------------------------------

    def begin(self, headers: Mapping[str, str], started_ns: int) -> RequestTrace:
        """New ids for the server span, in the ``traceparent``'s trace when one came (and is valid)."""
        parent = None
        traceparent = headers.get("traceparent")
        if traceparent is not None:
            carrier = {"traceparent": traceparent}
            tracestate = headers.get("tracestate")
            if tracestate is not None:
                carrier["tracestate"] = tracestate
            context = trace.get_current_span(self._propagator.extract(carrier)).get_span_context()
            parent = context if context.is_valid else None
        ids = _new_ids(parent.trace_id if parent is not None else None)
        return RequestTrace(ids, parent, started_ns, time.time_ns() - time.perf_counter_ns())

    # -- answer -------------------------------------------------------------------

    def finish(self, request: RequestTrace, answer: TracedAnswer) -> bool:
        """Emit the request's spans if its trace is kept; ``True`` if kept."""
        parent_sampled = None if request.parent is None else request.parent.trace_flags.sampled
        duration_ns = answer.ended_ns - request.started_ns
        if not self.sampler.should_keep(request.ids.trace_id, parent_sampled=parent_sampled,
                                        status_code=answer.status_code, duration_ns=duration_ns):
            return False
        offset_ns = request.wall_offset_ns
        trace_state = request.parent.trace_state if request.parent is not None else TraceState()
        server = SpanContext(request.ids.trace_id, request.ids.span_id, is_remote=False, trace_flags=_SAMPLED,
                             trace_state=trace_state)
        batches = self._batches_of(answer.items)
        first_seen = [batch for batch in batches if self._is_first_sight(batch)]
        if self._send_batches is not None:
            if first_seen:
                self._send_batches(first_seen)
        else:
            for batch in first_seen:
                self._emit_batch(batch, offset_ns)
        attributes = self._server_attributes(answer)
        status = Status(StatusCode.ERROR, answer.error_code) if answer.status_code >= 500 else Status(StatusCode.UNSET)
        self._end(ReadableSpan(
            f"POST {answer.http_route}", server, request.parent, self._resource, attributes,
            links=[Link(_span_context(batch.ids)) for batch in batches], kind=SpanKind.SERVER, status=status,
            start_time=request.started_ns + offset_ns, end_time=answer.ended_ns + offset_ns,
            instrumentation_scope=self._scope))
        if answer.as_rows:
            for index, item in enumerate(answer.items):
                if item.outcome is not None:
                    self._emit_row(server, index, item, offset_ns)
        elif answer.items and answer.items[0].outcome is not None:
            self._emit_stages(server, answer.items[0].outcome, offset_ns)
        if answer.respond is not None:
            self._emit_stage(server, "respond", answer.respond[0], answer.respond[1], offset_ns)
        return True

    def _server_attributes(self, answer: TracedAnswer) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {
            "http.request.method": "POST",
            "http.route": answer.http_route,
            "http.response.status_code": answer.status_code,
            **self._model,
        }
        if answer.as_rows or not answer.items:
            attributes["mmserve.route"] = answer.metrics_route
            attributes["mmserve.rows"] = len(answer.items)
            attributes["mmserve.image.count"] = sum(len(item.parsed.images) for item in answer.items)
        else:
            attributes.update(item_attributes(answer.items[0], self._default_timeout_ms))
        if answer.error_code is not None:
            attributes["mmserve.error.code"] = answer.error_code
        if answer.status_code >= 500:
            attributes["error.type"] = str(answer.status_code)
        if answer.error_row is not None:
            attributes["mmserve.error.row"] = answer.error_row
        return attributes

    # -- child spans ----------------------------------------------------------------

    def _emit_row(self, server: SpanContext, index: int, item: TracedItem, offset_ns: int) -> None:
        outcome = item.outcome
        assert outcome is not None
        row = _span_context(_new_ids(server.trace_id))
        attributes = item_attributes(item, self._default_timeout_ms)
        attributes["mmserve.row"] = index
        batch = outcome.result.batch_trace
        ended_ns = batch.started_ns + batch.elapsed_ns if batch is not None else (
            outcome.decode_started_ns + outcome.decode_ns)
        self._end(ReadableSpan(
            "row", row, server, self._resource, attributes, kind=SpanKind.INTERNAL,
            start_time=outcome.decode_started_ns + offset_ns, end_time=ended_ns + offset_ns,
            instrumentation_scope=self._scope))
        self._emit_stages(row, outcome, offset_ns)

    def _emit_stages(self, parent: SpanContext, outcome: IntakeOutcome, offset_ns: int) -> None:
        """decode, then queue and the compute stages the request's batch ran for it."""
        self._emit_stage(parent, "decode", outcome.decode_started_ns, outcome.decode_ns, offset_ns)
        batch = outcome.result.batch_trace
        if batch is None:
            return
        stage_ns = outcome.result.stage_ns
        if "queue" in stage_ns:
            self._emit_stage(parent, "queue", batch.started_ns - stage_ns["queue"], stage_ns["queue"], offset_ns)
        for stage in _COMPUTE_STAGES:
            started_ns = batch.stage_starts_ns.get(stage)
            if stage in stage_ns and started_ns is not None:
                self._emit_stage(parent, stage, started_ns, stage_ns[stage], offset_ns)

    def _emit_stage(self, parent: SpanContext, name: str, started_ns: int, duration_ns: int, offset_ns: int) -> None:
        self._end(ReadableSpan(
            name, _span_context(_new_ids(parent.trace_id)), parent, self._resource,
            {"mmserve.stage": name}, kind=SpanKind.INTERNAL,
            start_time=started_ns + offset_ns, end_time=started_ns + duration_ns + offset_ns,
            instrumentation_scope=self._scope))

    # -- batch spans -------------------------------------------------------------------

    @staticmethod
    def _batches_of(items: Sequence[TracedItem]) -> list[BatchTrace]:
        batches: dict[int, BatchTrace] = {}
        for item in items:
            batch = item.outcome.result.batch_trace if item.outcome is not None else None
            if batch is not None:
                batches.setdefault(batch.ids.span_id, batch)
        return list(batches.values())

    def emit_batches(self, batches: Sequence[BatchTrace]) -> None:
        """The engine's side of ``send_batches``: each batch's span, unless one was already exported."""
        offset_ns = time.time_ns() - time.perf_counter_ns()  # this process's anchor: the clocks are the machine's
        for batch in batches:
            if self._is_first_sight(batch):
                self._emit_batch(batch, offset_ns)

    def _is_first_sight(self, batch: BatchTrace) -> bool:
        """Whether ``batch`` is seen here for the first time (then remembered): its span is exported once."""
        if batch.ids.span_id in self._emitted_batches:
            return False
        self._emitted_batches[batch.ids.span_id] = None
        if len(self._emitted_batches) > _REMEMBERED_BATCHES:
            self._emitted_batches.popitem(last=False)
        return True

    def _emit_batch(self, batch: BatchTrace, offset_ns: int) -> None:
        """The batch's span (the first time one of its requests is kept)."""
        self._end(ReadableSpan(
            f"batch {batch.lane.value}", _span_context(batch.ids), None, self._resource, batch_attributes(batch),
            links=[Link(_span_context(ids, TraceFlags(TraceFlags.DEFAULT))) for ids in batch.links],
            kind=SpanKind.INTERNAL, start_time=batch.started_ns + offset_ns,
            end_time=batch.started_ns + batch.elapsed_ns + offset_ns, instrumentation_scope=self._scope))

    def _end(self, span: ReadableSpan) -> None:
        self.processor.on_end(span)


def _new_ids(trace_id: int | None) -> SpanIds:
    """Ids of a request's span (in ``trace_id``'s trace if given): random and never zero, as W3C asks.

    The router draws its batch spans' ids by the same rule (``router.tracing.new_span_ids``); the
    server draws its own, so a request's spans are made from plain values, calling nothing back.
    """
    span_id = random.getrandbits(64) or 1
    return SpanIds(trace_id if trace_id else (random.getrandbits(128) or 1), span_id)


def _span_context(ids: SpanIds, flags: TraceFlags = _SAMPLED) -> SpanContext:
    return SpanContext(ids.trace_id, ids.span_id, is_remote=False, trace_flags=flags)
