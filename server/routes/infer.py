"""``POST /v1/infer``: the native API (JSON or multipart)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response

from router.intake import IntakeOutcome
from router.request import InferenceResult
from server.ingest import json_body
from server.http.error_mapping import api_error_from
from server.errors import ERROR_RESPONSE_SCHEMA, ApiError
from server.http.traced_answer import TracedAnswer, TracedItem, answer_traced
from server.ingest.inputs import ParsedInput, intake_item, parse_json, parse_multipart
from server.runtime.monitoring_setup import cache_hit_of, request_inputs
from server.schemas import InferResponse
from server.state import ServerState

logger = logging.getLogger(__name__)

router = APIRouter()
T = TypeVar("T")

MULTIPART_SCHEMA = {
    "type": "object",
    "properties": {
        "image": {"type": "string", "format": "binary", "description": "An encoded image file."},
        "text": {"type": "string"},
        "priority": {"type": "string", "enum": ["high", "normal", "low"]},
        "timeout_ms": {"type": "integer", "minimum": 1},
        "truncate": {"type": "boolean"},
    },
}

_ERROR_RESPONSES = {
    status: {"description": description, "content": {"application/json": {"schema": ERROR_RESPONSE_SCHEMA}}}
    for status, description in {
        400: "Malformed body, base64 or image.",
        413: "Body or image over its limit.",
        415: "Unsupported content type or image format.",
        422: "A field fails validation (names the field and the limit).",
        500: "The model failed on this item (the error id is logged).",
        503: "Overloaded, warming up or shutting down (see Retry-After).",
        504: "The request's deadline passed before it was computed.",
    }.items()
}


class ClientDisconnectedError(Exception):
    """The client closed the connection before its answer was ready."""


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client goes away first; then cancel it.

    Cancelling the router's ``submit`` cancels the queued item, so a request
    whose client disconnected never reaches the model.
    """
    work_task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({work_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not work_task.done():
        work_task.cancel()
        raise ClientDisconnectedError()
    return work_task.result()


def _ms(nanoseconds: int) -> float:
    return round(nanoseconds / 1e6, 3)


def _response_body(request_id: str, state: ServerState, result: InferenceResult,
                   prepared: IntakeOutcome, images_as_list: bool) -> dict:
    """Everything but ``timings_ms``, which is added once the body is built.

    A request that sent ``images`` gets ``image_embeddings`` and a per-image
    ``cache.images``; one that sent ``image`` gets ``image_embedding`` and
    ``cache.image``, as before multi-image requests existed.
    """
    body: dict = {
        "id": request_id,
        "route": result.route.value,
        "model": state.model_description,
    }
    if images_as_list:
        body["image_embeddings"] = list(result.image_embeddings)
    for key, value in (
        ("image_embedding", None if images_as_list else result.image_embedding),
        ("text_embedding", result.text_embedding),
        ("fused_embedding", result.fused_embedding),
        ("score", result.score),
        ("match_score", result.match_score),
    ):
        if value is not None:
            body[key] = value
    if prepared.text is not None:
        body["text"] = {
            "num_tokens": len(prepared.text.token_ids),
            "truncated": prepared.text.is_truncated,
            "num_tokens_before_truncation": prepared.text.num_tokens_before_truncation,
        }
    joint = prepared.joint
    if joint is not None and joint.num_images and prepared.text is not None:
        body["joint_tokens"] = {"num_images": joint.num_images, "tokens_per_image": joint.tokens_per_image,
                                "num_text_tokens": joint.num_text_tokens, "total": joint.total,
                                "limit": joint.max_joint_tokens}
    body["cache"] = prepared.plan.statuses(images_as_list=images_as_list)
    return body


async def _parse(request: Request, state: ServerState) -> ParsedInput:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        return parse_json(await request.body(), state.settings)
    if content_type == "multipart/form-data":
        return await parse_multipart(request, state.settings)
    raise ApiError(415, "unsupported_media_type",
                   f"content type {content_type or '(none)'!r} is not accepted; send application/json "
                   "or multipart/form-data", "content-type")


@router.post(
    "/v1/infer",
    response_model=InferResponse,
    responses=_ERROR_RESPONSES,
    summary="Embed an image, a text or both (fused), in one request.",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}},
                "multipart/form-data": {"schema": MULTIPART_SCHEMA},
            },
        }
    },
)
async def infer(request: Request) -> Response:
    started_ns = time.perf_counter_ns()
    state: ServerState = request.app.state.mmserve
    request_id = uuid.uuid4().hex
    tracer = state.tracer  # None while tracing is off: then nothing below touches a trace
    trace = tracer.begin(request.headers, started_ns) if tracer is not None else None
    route_label = "invalid"
    stage_ns: dict[str, int] = {}
    parsed: ParsedInput | None = None
    prepared: IntakeOutcome | None = None
    respond: tuple[int, int] | None = None
    error_code: str | None = None
    try:
        parsed = await _parse(request, state)
        route_label = parsed.route
        item = intake_item(parsed, request_id, trace.ids if trace is not None else None)
        prepared = await until_disconnected(request, state.intake.run_one(item, started_ns))
        result = prepared.result
        stage_ns["decode"] = prepared.decode_ns
        stage_ns.update(result.stage_ns)
        respond_started_ns = time.perf_counter_ns()
        body = _response_body(request_id, state, result, prepared, parsed.images_as_list)
        if prepared.joint is not None:
            state.metrics.joint_tokens.labels(route=result.route.value).observe(prepared.joint.total)
        stage_ns["respond"] = time.perf_counter_ns() - respond_started_ns
        respond = (respond_started_ns, stage_ns["respond"])
        stage_ns["total"] = time.perf_counter_ns() - started_ns
        body["timings_ms"] = {stage: _ms(ns) for stage, ns in stage_ns.items()}
        response = Response(json_body.dumps(body), media_type="application/json")
        # Answered requests only: an error's stages are partial, and fast refusals
        # (503 when shedding) would pull the latency digests down just as things get
        # slow. Errors are counted in mmserve_requests_total{code}.
        state.monitor.record(result.route.value, stage_ns, batch_size=result.batch_size,
                             cache_hit=cache_hit_of(body["cache"]), inputs=request_inputs(parsed, prepared, "native"))
    except ClientDisconnectedError:
        # Nobody reads this answer; 499 is nginx's "client closed request", counted as such.
        error_code = "client_disconnected"
        response = ApiError(499, error_code, "the client closed the connection").response()
    except Exception as e:  # noqa: BLE001 - every failure becomes a JSON answer
        error = api_error_from(e)
        if error is None:
            logger.exception("unexpected error in request %s", request_id)
            error = ApiError(500, "internal_error", f"internal error (request id {request_id})")
        error_code = error.code
        response = error.response()
    ended_ns = time.perf_counter_ns()
    exemplar = None
    if trace is not None and tracer is not None:
        items = (TracedItem(parsed, prepared),) if parsed is not None else ()
        exemplar = answer_traced(tracer, trace, TracedAnswer(
            "/v1/infer", route_label, response.status_code, ended_ns, items, error_code, respond=respond),
            response)
    state.metrics.requests_total.labels(route=route_label, code=str(response.status_code)).inc()
    state.metrics.request_duration_seconds.labels(route=route_label).observe((ended_ns - started_ns) / 1e9,
                                                                             exemplar)
    response.headers["X-Request-ID"] = request_id
    return response
