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
last, so a longer path is never read as a model name. A path under the
served model that no route takes (``/v2/models/tiny/nonsense``) reaches the
metadata route and is answered 404 ``route_not_found``, not as an unknown
model. ``/config`` is Triton's model configuration, the same description
gRPC's ``ModelConfig`` sends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server.errors import ApiError
from server.protocols.kserve_v2_codec import (
    HEADER_LENGTH,
    RequestedOutput,
    V2InferRequest,
    V2InferResponse,
    decode_infer_request,
    encode_infer_response,
)
from server.protocols.kserve_v2_model import (
    MODEL_VERSION,
    choose_outputs,
    error_body,
    model_config,
    model_metadata,
    output_tensors,
    rows_from_request,
)
from server.protocols.rows import Failure, max_rows_per_request
from server.request_layer import Answered, Endpoint, Parsed, serve
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
    return failure.error.response(error_body(failure.error, failure.row_index))


def check_model(state: ServerState, model_name: str, model_version: str | None) -> None:
    names = state.served_names
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


def _unknown_route(state: ServerState, request: Request, model_name: str) -> ApiError | None:
    """A 404 naming the route when the path's leading part is the served model (``tiny/nonsense`` reached the
    metadata route, whose ``{model_name:path}`` takes any path): the model is known, the route is not."""
    parts = model_name.split("/")
    for cut in range(len(parts) - 1, 0, -1):
        if state.served_names.accepts("/".join(parts[:cut])):
            prefix = f"/v2/models/{'/'.join(parts[:cut])}"
            return ApiError(404, "route_not_found", f"no route {request.method} {request.url.path}; under {prefix} "
                            "mmserve answers GET (metadata), GET ready, GET config, POST infer, and each of them "
                            f"under versions/{MODEL_VERSION}", "path")
    return None


def _checked_model(request: Request, model_name: str, model_version: str | None) -> JSONResponse | None:
    """``None`` for the served model and version; else the 404 to answer (the route's, for an unknown route)."""
    state: ServerState = request.app.state.mmserve
    try:
        check_model(state, model_name, model_version)
    except ApiError as e:
        unknown_route = _unknown_route(state, request, model_name) if e.code == "model_not_found" else None
        return _error_response(Failure(unknown_route or e, None))
    return None


async def _model_metadata(request: Request, model_name: str, model_version: str | None) -> JSONResponse:
    refused = _checked_model(request, model_name, model_version)
    if refused is not None:
        return refused
    return JSONResponse(model_metadata(request.app.state.mmserve.served_model))


async def _model_config(request: Request, model_name: str, model_version: str | None) -> JSONResponse:
    """Triton's model configuration, the description gRPC's ``ModelConfig`` sends (``model_config``)."""
    refused = _checked_model(request, model_name, model_version)
    if refused is not None:
        return refused
    state: ServerState = request.app.state.mmserve
    return JSONResponse(model_config(state.served_model, max_rows_per_request(state.settings)))


async def _model_ready(request: Request, model_name: str, model_version: str | None) -> JSONResponse:
    refused = _checked_model(request, model_name, model_version)
    if refused is not None:
        return refused
    state: ServerState = request.app.state.mmserve
    is_ready = state.router.is_ready
    return JSONResponse({"name": model_name, "ready": is_ready}, status_code=200 if is_ready else 503)


@router.get("/v2/models/{model_name:path}/versions/{model_version}/ready", summary="200 when this version serves.")
async def model_version_ready(request: Request, model_name: str, model_version: str) -> JSONResponse:
    return await _model_ready(request, model_name, model_version)


@router.get("/v2/models/{model_name:path}/ready", summary="200 when the model serves.")
async def model_ready(request: Request, model_name: str) -> JSONResponse:
    return await _model_ready(request, model_name, None)


@router.get("/v2/models/{model_name:path}/versions/{model_version}/config",
            summary="Model configuration of one version (Triton's model_config, as JSON).")
async def model_version_config(request: Request, model_name: str, model_version: str) -> JSONResponse:
    return await _model_config(request, model_name, model_version)


@router.get("/v2/models/{model_name:path}/config",
            summary="Model configuration (Triton's model_config, as JSON): inputs, outputs, dims, max_batch_size.")
async def model_configuration(request: Request, model_name: str) -> JSONResponse:
    return await _model_config(request, model_name, None)


@dataclass
class _V2Call:
    """What answering one v2 inference request needs besides its rows."""

    request: V2InferRequest
    chosen: tuple[RequestedOutput, ...] = ()  # the outputs to send (choose_outputs), once the rows are known


@dataclass(frozen=True)
class V2Infer(Endpoint[_V2Call]):
    """``/v2/models/{name}[/versions/{version}]/infer``: each row is an item; errors name ``row i``."""

    model_name: str
    model_version: str | None
    http_route = "/v2/models/{model_name}/infer"
    metrics_label = METRICS_ROUTE
    protocol = "kserve_v2"

    async def parse(self, request: Request, state: ServerState) -> Parsed[_V2Call]:
        check_model(state, self.model_name, self.model_version)
        v2_request = decode_infer_request(await request.body(), request.headers.get(HEADER_LENGTH))
        return Parsed(rows_from_request(v2_request, state.settings), _V2Call(v2_request))

    def check(self, parsed: Parsed[_V2Call], state: ServerState) -> None:
        parsed.context.chosen = choose_outputs(parsed.context.request, state.served_model)

    def render(self, parsed: Parsed[_V2Call], answered: Answered, state: ServerState) -> Response:
        call = parsed.context
        encoded = encode_infer_response(V2InferResponse(
            model_name=state.served_model.name,
            model_version=MODEL_VERSION,
            outputs=output_tensors(call.chosen, [outcome.result for outcome in answered.outcomes],
                                   call.request),
            request_id=call.request.request_id,
        ))
        if encoded.header_length is None:
            return Response(encoded.body, media_type="application/json")
        return Response(encoded.body, media_type="application/octet-stream",
                        headers={HEADER_LENGTH: str(encoded.header_length)})

    def render_error(self, failure: Failure, parsed: Parsed[_V2Call] | None) -> Response:
        return _error_response(failure)


async def _infer(request: Request, model_name: str, model_version: str | None) -> Response:
    return await serve(request, V2Infer(model_name, model_version))


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
