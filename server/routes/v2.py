"""Open Inference Protocol v2 (KServe / Triton REST): health, metadata and inference.

Errors use the protocol's shape, ``{"error": "<code>: <message>"}``, with the
status ``/v1/infer`` gives the same cause (400/413/415/422 for the client's
fault, 404 for an unknown model or version, 503 + ``Retry-After`` when
shedding load, 504 past a deadline); the named code leads the message.
Inference requests count in ``mmserve_requests_total{route="v2"}``: one
request may hold rows of several lanes, and its latency is that of a whole
batch, so it gets its own label instead of skewing a lane's histogram.

A model served from a Hub id is named like it (``org/name``): the routes take
the name as a path, so ``/v2/models/org/name/infer`` works as tritonclient
sends it; the routes with a version come before those without, and metadata
last, so a longer path is never read as a model name.
"""

from __future__ import annotations

import logging
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server.errors import ApiError
from server.http.traced_answer import answer_traced
from server.ingest.inputs import ParsedInput
from server.protocols.kserve_v2_codec import (
    HEADER_LENGTH,
    V2InferResponse,
    decode_infer_request,
    encode_infer_response,
)
from server.protocols.kserve_v2_model import (
    MODEL_VERSION,
    choose_outputs,
    model_metadata,
    output_tensors,
    rows_from_request,
)
from server.protocols.model_names import served_model_names
from server.protocols.rows import Failure, RowOutcome, failure_from, infer_rows, traced_rows
from server.state import ServerState

logger = logging.getLogger(__name__)

router = APIRouter(tags=["Open Inference Protocol v2"])

METRICS_ROUTE = "v2"
EXTENSIONS = ("binary_tensor_data",)
SERVER_NAME = "mmserve"

_INFER_BODY = {
    "requestBody": {
        "required": True,
        "description": "A JSON inference request, optionally followed by binary tensor data "
                       f"(then {HEADER_LENGTH} gives the JSON part's size).",
        "content": {"application/json": {"schema": {"type": "object"}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def _error_response(failure: Failure) -> JSONResponse:
    error = failure.error
    where = f"row {failure.row_index}: " if failure.row_index is not None else ""
    headers = {}
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(error.retry_after_s)))
    return JSONResponse({"error": f"{error.code}: {where}{error.message}"}, status_code=error.status,
                        headers=headers)


def _check_model(state: ServerState, model_name: str, model_version: str | None) -> None:
    names = served_model_names(state.settings, state.bundle)
    served = names.served
    if not names.accepts(model_name):
        raise ApiError(404, "model_not_found", f"unknown model {model_name!r}; this server serves "
                       f"{names.described()}", "model_name")
    if model_version not in (None, "", MODEL_VERSION):
        raise ApiError(404, "model_version_not_found", f"model {served!r} has no version {model_version!r}; "
                       f"its only version is {MODEL_VERSION!r}", "model_version")


@router.get("/v2/health/live", summary="200 while the compute thread runs.")
async def live(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.mmserve
    is_live = state.router.is_alive
    return JSONResponse({"live": is_live}, status_code=200 if is_live else 503)


@router.get("/v2/health/ready", summary="200 once warmed up, until draining starts.")
async def ready(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.mmserve
    is_ready = state.router.is_ready
    return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)


@router.get("/v2", summary="Server metadata: name, version, protocol extensions.")
async def server_metadata(request: Request) -> JSONResponse:
    return JSONResponse({"name": SERVER_NAME, "version": request.app.version, "extensions": list(EXTENSIONS)})


async def _model_metadata(request: Request, model_name: str, model_version: str | None) -> JSONResponse:
    state: ServerState = request.app.state.mmserve
    try:
        _check_model(state, model_name, model_version)
    except ApiError as e:
        return _error_response(Failure(e, None))
    return JSONResponse(model_metadata(state.bundle))


async def _model_ready(request: Request, model_name: str, model_version: str | None) -> JSONResponse:
    state: ServerState = request.app.state.mmserve
    try:
        _check_model(state, model_name, model_version)
    except ApiError as e:
        return _error_response(Failure(e, None))
    is_ready = state.router.is_ready
    return JSONResponse({"name": model_name, "ready": is_ready}, status_code=200 if is_ready else 503)


@router.get("/v2/models/{model_name:path}/versions/{model_version}/ready", summary="200 when this version serves.")
async def model_version_ready(request: Request, model_name: str, model_version: str) -> JSONResponse:
    return await _model_ready(request, model_name, model_version)


@router.get("/v2/models/{model_name:path}/ready", summary="200 when the model serves.")
async def model_ready(request: Request, model_name: str) -> JSONResponse:
    return await _model_ready(request, model_name, None)


async def _infer(request: Request, model_name: str, model_version: str | None) -> Response:
    started_ns = time.perf_counter_ns()
    state: ServerState = request.app.state.mmserve
    request_id = uuid.uuid4().hex
    tracer = state.tracer  # None while tracing is off
    trace = tracer.begin(request.headers, started_ns) if tracer is not None else None
    rows: list[ParsedInput] = []
    outcomes: list[RowOutcome] = []
    respond_started_ns = 0
    failure: Failure | None = None
    try:
        _check_model(state, model_name, model_version)
        v2_request = decode_infer_request(await request.body(), request.headers.get(HEADER_LENGTH))
        rows = rows_from_request(v2_request, state.settings)
        chosen = choose_outputs(v2_request, state.bundle)
        outcomes = await infer_rows(state, rows, request_id, started_ns, protocol="kserve_v2",
                                    trace=trace.ids if trace is not None else None)
        respond_started_ns = time.perf_counter_ns()
        encoded = encode_infer_response(V2InferResponse(
            model_name=state.bundle.config.name,
            model_version=MODEL_VERSION,
            outputs=output_tensors(chosen, [outcome.result for outcome in outcomes]),
            request_id=v2_request.request_id,
        ))
        if encoded.header_length is None:
            response = Response(encoded.body, media_type="application/json")
        else:
            response = Response(encoded.body, media_type="application/octet-stream",
                                headers={HEADER_LENGTH: str(encoded.header_length)})
    except Exception as e:  # noqa: BLE001 - every failure becomes a protocol error answer
        failure = failure_from(e, request_id)
        response = _error_response(failure)
    ended_ns = time.perf_counter_ns()
    exemplar = None
    if trace is not None and tracer is not None:
        exemplar = answer_traced(tracer, trace, traced_rows(
            "/v2/models/{model_name}/infer", METRICS_ROUTE, response.status_code, ended_ns, rows, outcomes,
            failure, respond_started_ns), response)
    state.metrics.requests_total.labels(route=METRICS_ROUTE, code=str(response.status_code)).inc()
    state.metrics.request_duration_seconds.labels(route=METRICS_ROUTE).observe((ended_ns - started_ns) / 1e9,
                                                                               exemplar)
    response.headers["X-Request-ID"] = request_id
    return response


@router.post("/v2/models/{model_name:path}/versions/{model_version}/infer", summary="Inference on one version.",
             openapi_extra=_INFER_BODY)
async def infer_version(request: Request, model_name: str, model_version: str) -> Response:
    return await _infer(request, model_name, model_version)


@router.post("/v2/models/{model_name:path}/infer", summary="Run rows of text and/or images through the model.",
             openapi_extra=_INFER_BODY)
async def infer(request: Request, model_name: str) -> Response:
    return await _infer(request, model_name, None)


# Metadata last: "/v2/models/{name}" would otherwise take ".../ready" and ".../versions/1/ready".
@router.get("/v2/models/{model_name:path}/versions/{model_version}", summary="Model metadata of one version.")
async def model_version(request: Request, model_name: str, model_version: str) -> JSONResponse:
    return await _model_metadata(request, model_name, model_version)


@router.get("/v2/models/{model_name:path}", summary="Model metadata: inputs and outputs with datatypes and shapes.")
async def model(request: Request, model_name: str) -> JSONResponse:
    return await _model_metadata(request, model_name, None)
