"""``POST /v1/classify`` and ``POST /v1/rank``: zero-shot scores over cached label embeddings.

    body ──check (counts first)──> images: vision items (intake)      ─┐
                                   texts:  cached text segments,       ├─> one matrix product (pool) ──> best first
                                           misses through the text lane ┘

Scores are the model's own (``models.zero_shot``): classify gives what
transformers' ``zero-shot-image-classification`` pipeline gives (SigLIP's
sigmoid per label, CLIP's softmax over the labels), rank the family's
per-pair score as ``/v1/infer`` does. A model whose only image-text score is
mmserve's fusion head answers with the head's ``match_score`` once the head
is trained, and 422 ``no_calibrated_score`` before: never an uncalibrated
number. Requests count under ``route="classify"`` / ``route="rank"``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from models.scores import CalibratedScore
from models.zero_shot import best_first, classify_score_kind, classify_scores, pair_scores, stack_embeddings
from monitoring import RequestInputs
from router.errors import IntakeItemError
from router.image_header import images_encoding, largest_image_pixels
from router.request import Priority
from router.segments import ImageContent
from router.tracing import SpanIds
from router.zero_shot import EncodedImages, EncodedTexts, ZeroShotEncoder, ZeroShotOptions
from server.errors import ERROR_RESPONSE_SCHEMA, ApiError
from server.http.error_mapping import api_error_from
from server.http.traced_answer import TracedAnswer, TracedItem, answer_traced
from server.ingest import json_body
from server.ingest.inputs import ParsedInput
from server.protocols.zero_shot_schemas import (
    ClassifyRequest,
    ClassifyResponse,
    RankRequest,
    RankResponse,
    classify_input,
    rank_input,
)
from server.request_layer import ClientDisconnectedError, until_disconnected
from server.runtime.monitoring_setup import cache_hit_of
from server.state import ServerState

logger = logging.getLogger(__name__)

router = APIRouter(tags=["Zero-shot"])

METRICS_ROUTES = {"/v1/classify": "classify", "/v1/rank": "rank"}  # the route label of each path's requests

_ERROR_RESPONSES = {
    status: {"description": description, "content": {"application/json": {"schema": ERROR_RESPONSE_SCHEMA}}}
    for status, description in {
        400: "Malformed body, base64 or image.",
        413: "Body or image over its limit.",
        415: "Unsupported image format.",
        422: "A field fails validation (names the field and the limit), or the model has no calibrated score.",
        500: "The model failed on this item (the error id is logged).",
        503: "Overloaded, warming up or shutting down (see Retry-After).",
        504: "The request's deadline passed before it was computed.",
    }.items()
}


# -- the per-request layer of these routes ----------------------------------------------------------------


@dataclass
class RequestContext:
    """What a handler gets from the per-request layer, and what it leaves there for the monitor and tracer."""

    state: ServerState
    request_id: str
    started_ns: int
    trace: SpanIds | None
    stage_ns: dict[str, int] = field(default_factory=dict)
    batch_size: int | None = None
    cache_hit: bool | None = None
    inputs: RequestInputs | None = None
    traced_items: tuple[TracedItem, ...] = ()
    respond: tuple[int, int] | None = None


Handler = Callable[[RequestContext, bytes], Awaitable[dict]]


async def answer_request(request: Request, http_route: str, metrics_route: str, handle: Handler) -> Response:
    """The one per-request wrapper of these routes: id, arrival clock, trace, request metrics, monitor record.

    ``handle`` parses the body and returns the answer's body (without
    ``timings_ms``, added here); whatever it raises becomes a JSON error.
    """
    started_ns = time.perf_counter_ns()
    state: ServerState = request.app.state.mmserve
    request_id = uuid.uuid4().hex
    tracer = state.tracer
    trace = tracer.begin(request.headers, started_ns) if tracer is not None else None
    context = RequestContext(state, request_id, started_ns, trace.ids if trace is not None else None)
    error_code: str | None = None
    try:
        body_bytes = await request.body()
        body = await until_disconnected(request, handle(context, body_bytes))
        respond_started_ns = time.perf_counter_ns()
        context.stage_ns["total"] = respond_started_ns - started_ns
        body["timings_ms"] = {stage: round(ns / 1e6, 3) for stage, ns in context.stage_ns.items()}
        response = Response(json_body.dumps(body), media_type="application/json")
        context.respond = (respond_started_ns, time.perf_counter_ns() - respond_started_ns)
        state.monitor.record(metrics_route, context.stage_ns, batch_size=context.batch_size,
                             cache_hit=context.cache_hit, inputs=context.inputs)
    except ClientDisconnectedError:
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
        exemplar = answer_traced(tracer, trace, TracedAnswer(
            http_route, metrics_route, response.status_code, ended_ns, context.traced_items, error_code,
            respond=context.respond, as_rows=True), response)
    state.metrics.requests_total.labels(route=metrics_route, code=str(response.status_code)).inc()
    state.metrics.request_duration_seconds.labels(route=metrics_route).observe((ended_ns - started_ns) / 1e9,
                                                                               exemplar)
    response.headers["X-Request-ID"] = request_id
    return response


# -- shared by both routes --------------------------------------------------------------------------------


def _validated(model: type[BaseModel], body: bytes) -> BaseModel:
    try:
        document = json_body.loads(body)
    except (json_body.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, "invalid_json", f"body is not valid JSON: {e}", "body") from e
    try:
        return model.model_validate(document)
    except ValidationError as e:
        first = e.errors()[0]
        location = ".".join(str(part) for part in first["loc"]) or "body"
        raise ApiError(422, "invalid_request", f"{location}: {first['msg']}", location) from e


@dataclass(frozen=True)
class _Scoring:
    """How this model scores a pair: its calibrated score, or (``score`` None) its trained fusion head."""

    score: CalibratedScore | None


def _scoring(state: ServerState) -> _Scoring:
    """The model's zero-shot score; 422 when it has none this endpoint may answer with."""
    model = state.bundle.model
    if getattr(model, "text", None) is None:
        raise ApiError(422, "no_text_tower", f"model {state.bundle.config.name!r} has no text encoder to embed "
                                             "labels with", "model")
    if model.score is not None:
        return _Scoring(model.score)
    if state.model_description["fusion_head"] == "trained":
        return _Scoring(None)
    raise ApiError(422, "no_calibrated_score",
                   f"model {state.bundle.config.name!r} has no calibrated image-text score (family "
                   f"{state.model_description['family']!r}) and its fusion head is untrained; train one "
                   "(mmserve train-fusion) to classify and rank with its match_score", "model")


def _encoder(state: ServerState) -> ZeroShotEncoder:
    if state.zero_shot is None:  # a state built without one (tests): the server's own parts
        state.zero_shot = ZeroShotEncoder(state.router, state.intake, state.decode_pool)
    return state.zero_shot


def _options(context: RequestContext, request: ClassifyRequest | RankRequest) -> ZeroShotOptions:
    return ZeroShotOptions(request_id=context.request_id, priority=Priority(request.priority),
                           timeout_ms=request.timeout_ms, truncate=request.truncate, use_cache=request.use_cache,
                           trace=context.trace)


def _named(error: IntakeItemError, field_of: Callable[[int], str]) -> ApiError | IntakeItemError:
    """An item's failure as its own answer, its field the item's (``labels[3]``); 503/504 keep theirs."""
    inner = api_error_from(error.error)
    if inner is None:
        return error
    if inner.status in (503, 504):
        return inner
    name = field_of(error.item_index)
    return ApiError(inner.status, inner.code, f"{name}: {inner.message}", name, inner.retry_after_s)


async def _encode(encoder: ZeroShotEncoder, context: RequestContext, options: ZeroShotOptions,
                  images: Sequence[ImageContent], texts: Sequence[str], image_field: Callable[[int], str],
                  text_field: Callable[[int], str]) -> tuple[EncodedImages, EncodedTexts]:
    """Images and texts at once; a failure names its item; the other side is cancelled."""
    image_task = asyncio.ensure_future(encoder.encode_images(images, options, context.started_ns))
    text_task = asyncio.ensure_future(encoder.encode_texts(texts, options, context.started_ns))
    tasks = {image_task: image_field, text_task: text_field}
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:  # one side failed, or the request was cancelled: the other side stops and settles its plans
        if not all(task.done() for task in tasks):
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    for task, field_of in tasks.items():
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise (_named(error, field_of) if isinstance(error, IntakeItemError) else error) from error
    return image_task.result(), text_task.result()


def _record(context: RequestContext, images: Sequence[ImageContent], encoded_images: EncodedImages,
            encoded_texts: EncodedTexts, priority: str, scored_ns: int) -> dict[str, object]:
    """Fill the context's stages and monitor facts; returns the answer's ``cache`` field."""
    first = encoded_images.outcomes[0]
    context.stage_ns.update(first.result.stage_ns)
    context.stage_ns["decode"] = max([encoded_texts.prepare_ns, *(o.decode_ns for o in encoded_images.outcomes)])
    if encoded_texts.text_ns:
        context.stage_ns["text"] = encoded_texts.text_ns
    context.stage_ns["score"] = scored_ns
    context.batch_size = first.result.batch_size
    image_statuses = [outcome.plan.image_statuses()[0] for outcome in encoded_images.outcomes]
    counts = encoded_texts.status_counts()
    text_statuses = [status for status, num in counts.items() for _ in range(num)]
    context.cache_hit = cache_hit_of({"images": image_statuses, "texts": text_statuses})
    context.inputs = RequestInputs.of(
        largest_image_pixels=largest_image_pixels(images), image_encoding=images_encoding(images),
        num_text_tokens=max(len(tokens.token_ids) for tokens in encoded_texts.tokens), num_images=len(images),
        priority=priority, protocol="native")
    return {"images": image_statuses, "texts": counts}


def _traced_images(images: Sequence[ImageContent], encoded: EncodedImages | None,
                   options: ZeroShotOptions) -> tuple[TracedItem, ...]:
    outcomes = encoded.outcomes if encoded is not None else (None,) * len(images)
    return tuple(TracedItem(ParsedInput(None, (content,), options.priority.value, options.timeout_ms,
                                        options.truncate, options.use_cache), outcome)
                 for content, outcome in zip(images, outcomes))


# -- POST /v1/classify ------------------------------------------------------------------------------------


async def _classify(context: RequestContext, body: bytes) -> dict:
    state = context.state
    request = _validated(ClassifyRequest, body)
    checked = classify_input(request, state.settings)  # type: ignore[arg-type]
    scoring = _scoring(state)
    options = _options(context, request)  # type: ignore[arg-type]
    context.traced_items = _traced_images(checked.images, None, options)
    encoder = _encoder(state)
    image_field = (lambda i: f"images[{i}]") if checked.images_as_list else (lambda i: "image")
    images, texts = await _encode(encoder, context, options, checked.images, checked.texts, image_field,
                                  lambda i: f"labels[{i}]")
    context.traced_items = _traced_images(checked.images, images, options)
    scored_started_ns = time.perf_counter_ns()
    if scoring.score is not None:
        scores = (await encoder.off_loop(
            _classify_matrix, scoring.score, [s.pooled for s in images.segments],
            [s.pooled for s in texts.segments]))  # (N, L)
        score_kind = classify_score_kind(scoring.score.kind).value
    else:
        scores = await encoder.head_scores(checked.images, checked.texts, options, context.started_ns)  # (N, L)
        score_kind = "match_score"
    cache = _record(context, checked.images, images, texts, request.priority,
                    time.perf_counter_ns() - scored_started_ns)
    results = []
    for row in scores.tolist():
        order = best_first(row, request.top_k)  # type: ignore[attr-defined]
        results.append({"labels": [{"label": checked.labels[j], "score": row[j]} for j in order]})
    return {"id": context.request_id, "model": state.model_description, "score_kind": score_kind,
            "results": results, "cache": cache}


def _classify_matrix(score: CalibratedScore, images: list, texts: list) -> np.ndarray:
    """(N, L) classify scores on the host (runs in the pool: torch stays off the event loop)."""
    return classify_scores(score, stack_embeddings(images), stack_embeddings(texts)).numpy()


@router.post(
    "/v1/classify", response_model=ClassifyResponse, responses=_ERROR_RESPONSES,
    summary="Score labels for an image, as the model's zero-shot image classification pipeline does.",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/ClassifyRequest"}}}}},
)
async def classify(request: Request) -> Response:
    return await answer_request(request, "/v1/classify", METRICS_ROUTES["/v1/classify"], _classify)


# -- POST /v1/rank ----------------------------------------------------------------------------------------


def _pair_matrix(score: CalibratedScore, images: list, texts: list) -> np.ndarray:
    """(N, L) per-pair scores on the host (runs in the pool)."""
    return pair_scores(score, stack_embeddings(images), stack_embeddings(texts)).numpy()


async def _rank(context: RequestContext, body: bytes) -> dict:
    state = context.state
    request = _validated(RankRequest, body)
    checked = rank_input(request, state.settings)  # type: ignore[arg-type]
    scoring = _scoring(state)
    options = _options(context, request)  # type: ignore[arg-type]
    encoder = _encoder(state)
    if checked.query_text is not None:
        image_contents, texts = checked.candidate_images, (checked.query_text,)
        image_field, text_field = (lambda i: f"candidates[{i}]"), (lambda i: "query")
    else:
        image_contents, texts = (checked.query_image,), checked.candidate_texts
        image_field, text_field = (lambda i: "query"), (lambda i: f"candidates[{i}]")
    context.traced_items = _traced_images(image_contents, None, options)
    images, encoded_texts = await _encode(encoder, context, options, image_contents, texts, image_field, text_field)
    context.traced_items = _traced_images(image_contents, images, options)
    scored_started_ns = time.perf_counter_ns()
    if scoring.score is not None:
        scores = (await encoder.off_loop(_pair_matrix, scoring.score, [s.pooled for s in images.segments],
                                         [s.pooled for s in encoded_texts.segments]))  # (N, L)
        score_kind = scoring.score.kind.value
    else:
        scores = await encoder.head_scores(image_contents, texts, options, context.started_ns)  # (N, L)
        score_kind = "match_score"
    cache = _record(context, image_contents, images, encoded_texts, request.priority,
                    time.perf_counter_ns() - scored_started_ns)
    flat = (scores[:, 0] if checked.query_text is not None else scores[0, :]).tolist()  # (candidates,)
    order = best_first(flat, request.top_k)
    return {"id": context.request_id, "model": state.model_description, "score_kind": score_kind,
            "results": [{"index": index, "score": flat[index]} for index in order], "cache": cache}


@router.post(
    "/v1/rank", response_model=RankResponse, responses=_ERROR_RESPONSES,
    summary="Rank candidates of the other modality against a text or image query, best first.",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/RankRequest"}}}}},
)
async def rank(request: Request) -> Response:
    return await answer_request(request, "/v1/rank", METRICS_ROUTES["/v1/rank"], _rank)
