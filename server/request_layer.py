"""The one request layer: what every inference request needs, whatever protocol it came by.

    route handler:  return await serve(request, ENDPOINT)      (gRPC: serve_call, server.grpc.infer_endpoint)
    ─────────────────────────────────────────────────────────────────────────────────────────────
    arrival   request id, arrival clock (perf_counter_ns), trace (tracer.begin)      this layer
    parse     endpoint.parse(request, state) -> Parsed(items, context)              the endpoint
    check     endpoint.check(parsed, state): refusals that come after the items     the endpoint
    run       endpoint.run(parsed, state, arrival) -> Ran; by default the items     the endpoint
              -> one router intake call (server.protocols.rows); the client's      (default: this layer)
              disconnect cancels it
    render    endpoint.render(parsed, answered, state) -> Response                  the endpoint
    close     trace finished (answer_traced), mmserve_requests_total,               this layer
              mmserve_request_duration_seconds, X-Request-ID
    record    per item: mmserve_joint_tokens, monitor.record (answered only), or    this layer
              the run's one RequestRecord under the metrics label
    a failure anywhere -> Failure (its ApiError, the row it came from) -> endpoint.render_error

Routes parse their protocol and render their answer; they never take the
time, make ids, trace or count. A request's answer, status, headers and
metrics therefore mean the same on every protocol, and so do its drift
records: a many-item protocol (``is_rows``) records each item's queue and
compute stages as its own request, but no ``decode`` or ``total`` sample
(those are the whole request's); a one-item protocol records every stage,
``respond`` and ``total`` included.

Adding an endpoint (``POST /v1/moderate``, say) takes a subclass and a route::

    class Moderate(Endpoint[ModerateRequest]):
        http_route, metrics_label, protocol = "/v1/moderate", "moderate", "moderate"

        async def parse(self, request, state):
            body = parse_moderate(await request.body())             # raise ApiError for bad input
            return Parsed(items_of(body, state.settings), body)     # one ParsedInput per item

        def render(self, parsed, answered, state):
            return JSONResponse(scores_of(parsed.context, answered.outcomes))

    @router.post("/v1/moderate")
    async def moderate(request: Request) -> Response:
        return await serve(request, Moderate())

``render_error`` (the protocol's error shape; default
``ApiError.response()``), ``check``, ``run`` and ``metrics_route`` have
defaults. An endpoint whose middle is not one intake call (``/v1/classify``
and ``/v1/rank``: labels through the segment cache, images through the intake,
one matrix product; ``server.routes.zero_shot``) overrides ``run``: it gets
the request's ``Arrival`` (id, arrival clock, trace ids, the items as the
intake takes them), times its own stages (``Arrival.timed``, or in what it
calls: zero-shot's scorer, ``server.protocols.zero_shot_run``) and returns a
``Ran``: the items' outcomes (traced as rows), its own result for ``render``
and, if the request is one latency record rather than one per item, a
``RequestRecord`` with its stages, which this layer records (``total`` added).
A new ``protocol`` label shows as ``other`` in drift attribution until
``monitoring.inputs`` lists it; ``metrics_label`` is a label of
``mmserve_requests_total``, so it is a fixed name, never one from the request.
"""

from __future__ import annotations

import abc
import functools
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastapi import Request
from starlette.responses import Response

from monitoring import RequestInputs
from router.intake import IntakeItem
from router.item_facts import ItemFacts
from router.tracing import SpanIds
from server.errors import ApiError
from server.http.client_disconnect import ClientDisconnectedError, until_disconnected
from server.http.traced_answer import TracedAnswer, TracedItem, answer_traced
from server.ingest.inputs import ParsedInput, intake_item
from server.protocols.rows import Failure, RowOutcome, failure_from, infer_rows
from server.runtime.monitoring_setup import cache_hit_of, request_inputs
from server.state import ServerState

C = TypeVar("C")
T = TypeVar("T")


@dataclass(frozen=True)
class Parsed(Generic[C]):
    """A parsed request: its items (what the intake runs) and whatever else its protocol needs to answer."""

    items: Sequence[ParsedInput]
    context: C


@dataclass(frozen=True)
class Arrival:
    """A request as this layer admitted it, for ``Endpoint.run``: id, arrival clock, trace ids, intake items."""

    request_id: str
    started_ns: int
    trace: SpanIds | None  # the server span, while tracing is on
    items: Sequence[IntakeItem]  # ``Parsed.items`` as the intake takes them, same order

    async def timed(self, work: Awaitable[T]) -> tuple[T, int]:
        """``work``'s result and how long it took (ns): a run step's own stage, on this layer's clock."""
        started_ns = time.perf_counter_ns()
        value = await work
        return value, time.perf_counter_ns() - started_ns


@dataclass(frozen=True)
class RequestRecord:
    """A request the monitor sees as one latency record, under its metrics label (``Endpoint.run`` says so).

    ``stage_ns`` are the run's stages; the layer adds ``total`` (arrival to the
    start of ``render``), records them and ``Answered.stage_ns`` shows them.
    """

    stage_ns: Mapping[str, int]
    batch_size: int | None
    cache_hit: bool | None
    inputs: RequestInputs | None


@dataclass(frozen=True)
class Ran:
    """What ``Endpoint.run`` gives back: every item's outcome in order, and what an endpoint's own run adds.

    ``value``: the run's own result, for ``render`` (``Answered.value``).
    ``record``: set, the request is one monitor record with these stages
    (no joint-token observation); ``None``, each answered item is one.
    """

    outcomes: Sequence[RowOutcome]
    value: Any = None
    record: RequestRecord | None = None


class Answered:
    """What ``Endpoint.render`` gets: the request's id, every item's outcome in order, and the run's value."""

    def __init__(self, request_id: str, started_ns: int, respond_started_ns: int, ran: Ran) -> None:
        self.request_id = request_id
        self.outcomes = ran.outcomes
        self.value = ran.value
        self.record = ran.record
        self._started_ns = started_ns
        self._respond_started_ns = respond_started_ns
        self._respond_ns: int | None = None
        self._stage_ns: dict[str, int] | None = None

    @property
    def respond(self) -> tuple[int, int]:
        """``(started_ns, duration_ns)`` of building the answer, once it ended (the ``respond`` span)."""
        assert self._respond_ns is not None, "respond has not ended"
        return self._respond_started_ns, self._respond_ns

    def end_respond(self) -> None:
        """The answer is built (``serve`` calls it when ``render`` returns); a no-op after ``stage_ns``."""
        if self._respond_ns is None:
            self._respond_ns = time.perf_counter_ns() - self._respond_started_ns

    def stage_ns(self) -> dict[str, int]:
        """A one-item request's stage times (``decode``, its batch's stages, ``respond``, ``total``).

        With a ``RequestRecord``: its stages and ``total`` (up to ``render``).

        ``respond`` and ``total`` end at the first call: call it last, right
        before serialising, when the answer shows its timings (``/v1/infer``'s
        ``timings_ms``). The monitor records the same numbers. Without a call,
        they end when ``render`` returns (``end_respond``).
        """
        if self._stage_ns is None and self.record is not None:  # the run's stages, up to render
            self._stage_ns = {**self.record.stage_ns, "total": self._respond_started_ns - self._started_ns}
        if self._stage_ns is None:
            outcome = self.outcomes[0].prepared
            now_ns = time.perf_counter_ns()
            if self._respond_ns is None:
                self._respond_ns = now_ns - self._respond_started_ns
            self._stage_ns = {"decode": outcome.decode_ns, **outcome.result.stage_ns,
                              "respond": self._respond_ns,
                              "total": self._respond_started_ns + self._respond_ns - self._started_ns}
        return self._stage_ns


class Endpoint(abc.ABC, Generic[C]):
    """One inference protocol as the request layer drives it: parse, check, render, render an error.

    Attributes:
        http_route: The route's template, for the server span's name (``POST {http_route}``).
        metrics_label: ``route`` of ``mmserve_requests_total`` and ``mmserve_request_duration_seconds``.
        protocol: The items' ``protocol`` in drift attribution (``native``, ``kserve_v2``, ``openai``).
        is_rows: Many items per request: each item gets a ``row`` span and its own latency record,
            and ``render_error`` may name the row. ``False``: exactly one item, whose stages are the request's.
        rows_field: The protocol's field that holds the rows, named by a refusal of them all (``too_many_rows``).
    """

    http_route: str
    metrics_label: str
    protocol: str
    is_rows: bool = True
    rows_field: str = "inputs"

    @abc.abstractmethod
    async def parse(self, request: Request, state: ServerState) -> Parsed[C]:
        """The request's items (and context); raises ``ApiError`` naming the field for bad input."""

    def check(self, parsed: Parsed[C], state: ServerState) -> None:
        """Refusals that need the items (raises); they still show on the request's span."""

    @abc.abstractmethod
    def render(self, parsed: Parsed[C], answered: Answered, state: ServerState) -> Response:
        """The protocol's answer."""

    async def run(self, parsed: Parsed[C], state: ServerState, arrival: Arrival) -> Ran:
        """The items' outcomes: by default every item through one router intake call, at once."""
        return Ran(await infer_rows(state, parsed.items, arrival.items, arrival.started_ns, self.rows_field))

    def render_error(self, failure: Failure, parsed: Parsed[C] | None) -> Response:
        """The protocol's error answer (default: mmserve's ``{"error": {...}}``)."""
        return failure.error.response()

    def metrics_route(self, parsed: Parsed[C] | None) -> str:
        """The metrics ``route`` label; ``parsed`` is ``None`` when parsing failed."""
        return self.metrics_label


ENGINE_HEADER = "x-mmserve-engine"  # which engine computed the answer (0 with one engine)
_REQUEST_ID_BITS = random.Random()  # seeded from the OS once; reseeded in a forked child (below)
os.register_at_fork(after_in_child=_REQUEST_ID_BITS.seed)


# A version-4 UUID's fixed bits, as ``uuid.UUID(int=..., version=4)`` sets them: the variant (RFC 4122) and the version.
_UUID4_FIXED_MASK = (0xC000 << 48) | (0xF000 << 64)
_UUID4_FIXED_BITS = (0x8000 << 48) | (4 << 76)


def new_request_id() -> str:
    """A random (version 4) UUID as 32 hex digits, the ``X-Request-ID`` of one request.

    Drawn from a generator seeded by the OS rather than from ``uuid4``, which
    asks the OS for 16 bytes on every call: a system call per request. An id
    names a request; it guards nothing, so it need not be unpredictable. The
    fixed bits are set here rather than by building a ``uuid.UUID``: 0.4 us an id instead of 1.5.
    """
    return f"{_REQUEST_ID_BITS.getrandbits(128) & ~_UUID4_FIXED_MASK | _UUID4_FIXED_BITS:032x}"


async def serve(request: Request, endpoint: Endpoint) -> Response:
    """One request through ``endpoint``: the answer, with ``X-Request-ID`` (and ``traceparent`` while tracing)."""
    return await serve_call(request.app.state.mmserve, endpoint, request, request.headers,
                            functools.partial(until_disconnected, request))


async def serve_call(state: ServerState, endpoint: Endpoint, source: Any, headers: Mapping[str, str],
                     until_gone: Callable[[Awaitable[Ran]], Awaitable[Ran]]) -> Any:
    """One request of any protocol: ``source`` is what ``endpoint.parse`` reads (HTTP: the ``Request``;
    gRPC: the call), ``headers`` carry ``traceparent``, ``until_gone(work)`` awaits the run unless the client
    goes away first (then raises ``ClientDisconnectedError``, or an ``ApiError`` saying why it gave up).
    The answer is the endpoint's: anything with ``status_code`` and a ``headers`` mapping to add to."""
    started_ns = time.perf_counter_ns()
    request_id = new_request_id()
    tracer = state.tracer  # None while tracing is off: then nothing below touches a trace
    trace = tracer.begin(headers, started_ns) if tracer is not None else None
    parsed: Parsed | None = None
    items: list[IntakeItem] = []
    outcomes: Sequence[RowOutcome] = ()
    answered: Answered | None = None
    failure: Failure | None = None
    try:
        parsed = await endpoint.parse(source, state)
        span_ids = trace.ids if trace is not None else None
        items = [intake_item(row, f"{request_id}-{index}" if endpoint.is_rows else request_id, span_ids,
                             endpoint.protocol) for index, row in enumerate(parsed.items)]
        endpoint.check(parsed, state)
        ran = await until_gone(endpoint.run(parsed, state, Arrival(request_id, started_ns, span_ids, items)))
        outcomes = ran.outcomes
        answered = Answered(request_id, started_ns, time.perf_counter_ns(), ran)
        response = endpoint.render(parsed, answered, state)
        answered.end_respond()
    except ClientDisconnectedError:
        # Nobody reads this answer; 499 is nginx's "client closed request", counted as such.
        failure = Failure(ApiError(499, "client_disconnected", "the client closed the connection"), None)
        response = endpoint.render_error(failure, parsed)
    except Exception as e:  # noqa: BLE001 - every failure becomes the protocol's error answer
        failure = failure_from(e, request_id)
        response = endpoint.render_error(failure, parsed)
    ended_ns = time.perf_counter_ns()
    metrics_route = endpoint.metrics_route(parsed)
    exemplar = None
    if trace is not None and tracer is not None:
        exemplar = answer_traced(tracer, trace, _traced(endpoint, metrics_route, response.status_code, ended_ns,
                                                         parsed, items, outcomes, answered, failure), response)
    requests_total, request_duration = state.metrics.request_series(metrics_route, str(response.status_code))
    requests_total.inc()
    request_duration.observe((ended_ns - started_ns) / 1e9, exemplar)
    response.headers["X-Request-ID"] = request_id
    if answered is not None and failure is None:
        served_by = next((row.prepared.engine for row in answered.outcomes if isinstance(row, RowOutcome)), None)
        if served_by is not None:  # a request goes whole to one engine (server.workers.engine_dispatch)
            response.headers[ENGINE_HEADER] = str(served_by)
        # last: the answer is complete, and nothing comes back from monitoring
        _record(state, endpoint, metrics_route, answered)
    return response


def _record(state: ServerState, endpoint: Endpoint, metrics_route: str, answered: Answered) -> None:
    """Every answered item's joint tokens and latency record (an error's stages are partial: never recorded).

    Fast refusals (503 when shedding) would pull the latency digests down just
    as things get slow; errors are counted in ``mmserve_requests_total{code}``.
    A run's ``RequestRecord`` is the request's one record, under its metrics label.
    """
    if answered.record is not None:
        record = answered.record
        state.monitor.record(metrics_route, answered.stage_ns(), batch_size=record.batch_size,
                             cache_hit=record.cache_hit, inputs=record.inputs)
        return
    for outcome in answered.outcomes:
        prepared, result = outcome.prepared, outcome.result
        route = result.route.value
        if prepared.joint is not None:
            state.metrics.joint_tokens.labels(route=route).observe(prepared.joint.total)
        stage_ns = result.stage_ns if endpoint.is_rows else answered.stage_ns()
        state.monitor.record(route, stage_ns, batch_size=result.batch_size,
                             cache_hit=cache_hit_of(prepared.cache or {}), inputs=request_inputs(prepared.facts))


def _traced(endpoint: Endpoint, metrics_route: str, status_code: int, ended_ns: int, parsed: Parsed | None,
            items: Sequence[IntakeItem], outcomes: Sequence[RowOutcome], answered: Answered | None,
            failure: Failure | None) -> TracedAnswer:
    """The answer for the tracer (tracing on only): what each item sent and, if answered, its outcome.

    An item with no outcome (its request failed) shows the facts of what it
    sent (``ItemFacts.sent``, what the intake would have computed).
    """
    traced_items: tuple[TracedItem, ...] = ()
    if parsed is not None and outcomes:
        traced_items = tuple(TracedItem(row, outcome.prepared.facts, outcome.prepared)
                             for row, outcome in zip(parsed.items, outcomes))
    elif parsed is not None:
        traced_items = tuple(TracedItem(row, ItemFacts.sent(item)) for row, item in zip(parsed.items, items))
    respond = answered.respond if answered is not None and failure is None else None
    return TracedAnswer(
        endpoint.http_route, metrics_route, status_code, ended_ns, items=traced_items,
        error_code=failure.error.code if failure is not None else None,
        error_row=failure.row_index if failure is not None and endpoint.is_rows else None,
        respond=respond, as_rows=endpoint.is_rows,
    )
