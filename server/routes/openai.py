"""OpenAI-compatible ``POST /v1/embeddings`` and ``GET /v1/models``.

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``,
with the status and named ``code`` that ``/v1/infer`` gives the same cause;
``param`` names the offending item as ``input[i]`` (``input`` for a single
string). Requests count in ``mmserve_requests_total{route="openai"}``: one
request may mix text and image items, so it gets its own label instead of
skewing a lane's latency histogram.
"""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from server.errors import ApiError
from server.http.traced_answer import answer_traced
from server.ingest.inputs import ParsedInput
from server.protocols.openai_embeddings import (
    EmbeddingsRequest,
    check_dimensions,
    check_model,
    embeddings_response,
    error_body,
    items_from_request,
    model_card,
    parse_embeddings_request,
)
from server.protocols.model_names import served_model_names
from server.protocols.rows import Failure, RowOutcome, failure_from, infer_rows, traced_rows
from server.state import ServerState

router = APIRouter(tags=["OpenAI-compatible"])

METRICS_ROUTE = "openai"


def _error_response(failure: Failure, is_single_input: bool) -> JSONResponse:
    error = failure.error
    if failure.row_index is not None:
        param = "input" if is_single_input else f"input[{failure.row_index}]"
    else:
        param = error.field
    headers = {}
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(error.retry_after_s)))
    return JSONResponse(error_body(error, param), status_code=error.status, headers=headers)


def _created_unix_s(request: Request) -> int:
    return int(getattr(request.app.state, "created_unix_s", 0))


@router.get("/v1/models", summary="The served model, as OpenAI's model list.")
async def list_models(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.mmserve
    card = model_card(state.bundle.config.name, _created_unix_s(request), state.model_description)
    return JSONResponse({"object": "list", "data": [card]})


@router.get("/v1/models/{model_id:path}", summary="One model, as OpenAI's model object.")
async def retrieve_model(request: Request, model_id: str) -> JSONResponse:
    state: ServerState = request.app.state.mmserve
    try:
        check_model(model_id, served_model_names(state.settings, state.bundle))
    except ApiError as e:
        return _error_response(Failure(e, None), is_single_input=False)
    return JSONResponse(model_card(model_id, _created_unix_s(request), state.model_description))


@router.post(
    "/v1/embeddings",
    summary="Embed texts and images (data:image/... URIs), OpenAI-style.",
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": EmbeddingsRequest.model_json_schema()}}}},
)
async def embeddings(request: Request) -> JSONResponse:
    started_ns = time.perf_counter_ns()
    state: ServerState = request.app.state.mmserve
    request_id = uuid.uuid4().hex
    tracer = state.tracer  # None while tracing is off
    trace = tracer.begin(request.headers, started_ns) if tracer is not None else None
    is_single_input = False
    items: list[ParsedInput] = []
    outcomes: list[RowOutcome] = []
    respond_started_ns = 0
    failure: Failure | None = None
    try:
        embeddings_request = parse_embeddings_request(await request.body())
        is_single_input = isinstance(embeddings_request.input, str)
        check_model(embeddings_request.model, served_model_names(state.settings, state.bundle))
        items = items_from_request(embeddings_request, state.settings)
        check_dimensions(embeddings_request, items, state.bundle)
        outcomes = await infer_rows(state, items, request_id, started_ns, protocol="openai",
                                    trace=trace.ids if trace is not None else None)
        respond_started_ns = time.perf_counter_ns()
        response = JSONResponse(embeddings_response(embeddings_request, state.bundle.config.name, outcomes))
    except Exception as e:  # noqa: BLE001 - every failure becomes an OpenAI-shaped answer
        failure = failure_from(e, request_id)
        response = _error_response(failure, is_single_input)
    ended_ns = time.perf_counter_ns()
    exemplar = None
    if trace is not None and tracer is not None:
        exemplar = answer_traced(tracer, trace, traced_rows(
            "/v1/embeddings", METRICS_ROUTE, response.status_code, ended_ns, items, outcomes, failure,
            respond_started_ns), response)
    state.metrics.requests_total.labels(route=METRICS_ROUTE, code=str(response.status_code)).inc()
    state.metrics.request_duration_seconds.labels(route=METRICS_ROUTE).observe((ended_ns - started_ns) / 1e9,
                                                                               exemplar)
    response.headers["X-Request-ID"] = request_id
    return response
