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

Both are endpoints of the request layer (``server.request_layer``), which
owns the request's id, clock, trace, metrics and monitor record; their own
``run`` step replaces the layer's one intake call with the middle above and
times its ``score`` stage on the layer's clock.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from dataclasses import dataclass

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
from router.zero_shot import EncodedImages, EncodedTexts, ZeroShotEncoder, ZeroShotOptions
from server.errors import ERROR_RESPONSE_SCHEMA, ApiError
from server.http.error_mapping import api_error_from
from server.ingest import json_body
from server.ingest.inputs import ParsedInput
from server.protocols.rows import RowOutcome
from server.protocols.zero_shot_schemas import (
    ClassifyInput,
    ClassifyRequest,
    ClassifyResponse,
    RankInput,
    RankRequest,
    RankResponse,
    classify_input,
    rank_input,
)
from server.request_layer import Answered, Arrival, Endpoint, Parsed, Ran, RequestRecord, serve
from server.runtime.monitoring_setup import cache_hit_of
from server.state import ServerState

router = APIRouter(tags=["Zero-shot"])

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
    model = state.router.bundle.model  # answered where the model is (server.workers.engine_routes)
    if getattr(model, "text", None) is None:
        raise ApiError(422, "no_text_tower", f"model {state.served_model.name!r} has no text encoder to embed "
                                             "labels with", "model")
    if model.score is not None:
        return _Scoring(model.score)
    if state.model_description["fusion_head"] == "trained":
        return _Scoring(None)
    raise ApiError(422, "no_calibrated_score",
                   f"model {state.served_model.name!r} has no calibrated image-text score (family "
                   f"{state.model_description['family']!r}) and its fusion head is untrained; train one "
                   "(mmserve train-fusion) to classify and rank with its match_score", "model")


def _encoder(state: ServerState) -> ZeroShotEncoder:
    if state.zero_shot is None:  # a state built without one (tests): the server's own parts
        state.zero_shot = ZeroShotEncoder(state.router, state.intake, state.decode_pool)
    return state.zero_shot


@dataclass(frozen=True)
class _Call:
    """A checked classify or rank request as both run it: its images against its texts, each side's field names."""

    body: ClassifyRequest | RankRequest
    checked: ClassifyInput | RankInput
    scoring: _Scoring
    images: tuple[ImageContent, ...]
    texts: tuple[str, ...]
    image_field: Callable[[int], str]  # image i's field in errors (``images[2]``, ``query``)
    text_field: Callable[[int], str]


@dataclass(frozen=True)
class _Scored:
    """The run's result for ``render``: scores (images x texts), their kind, the answer's ``cache`` field."""

    matrix: np.ndarray  # (N, L)
    score_kind: str
    cache: dict[str, object]


def _named(error: IntakeItemError, field_of: Callable[[int], str]) -> ApiError | IntakeItemError:
    """An item's failure as its own answer, its field the item's (``labels[3]``); 503/504 keep theirs."""
    inner = api_error_from(error.error)
    if inner is None:
        return error
    if inner.status in (503, 504):
        return inner
    name = field_of(error.item_index)
    return ApiError(inner.status, inner.code, f"{name}: {inner.message}", name, inner.retry_after_s)


async def _encode(encoder: ZeroShotEncoder, call: _Call, options: ZeroShotOptions,
                  arrival_ns: int) -> tuple[EncodedImages, EncodedTexts]:
    """Images and texts at once; a failure names its item; the other side is cancelled."""
    image_task = asyncio.ensure_future(encoder.encode_images(call.images, options, arrival_ns))
    text_task = asyncio.ensure_future(encoder.encode_texts(call.texts, options, arrival_ns))
    tasks = {image_task: call.image_field, text_task: call.text_field}
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


def _request_record(call: _Call, encoded_images: EncodedImages, encoded_texts: EncodedTexts,
                    score_ns: int) -> tuple[dict[str, object], RequestRecord]:
    """The answer's ``cache`` field, and the request's latency record (its stages and facts) for the monitor."""
    first = encoded_images.outcomes[0]
    stage_ns = dict(first.result.stage_ns)
    stage_ns["decode"] = max([encoded_texts.prepare_ns, *(o.decode_ns for o in encoded_images.outcomes)])
    if encoded_texts.text_ns:
        stage_ns["text"] = encoded_texts.text_ns
    stage_ns["score"] = score_ns
    image_statuses = [outcome.plan.image_statuses()[0] for outcome in encoded_images.outcomes]
    counts = encoded_texts.status_counts()
    text_statuses = [status for status, num in counts.items() for _ in range(num)]
    inputs = RequestInputs.of(
        largest_image_pixels=largest_image_pixels(call.images), image_encoding=images_encoding(call.images),
        num_text_tokens=max(len(tokens.token_ids) for tokens in encoded_texts.tokens), num_images=len(call.images),
        priority=call.body.priority, protocol="native")
    record = RequestRecord(stage_ns, batch_size=first.result.batch_size,
                           cache_hit=cache_hit_of({"images": image_statuses, "texts": text_statuses}), inputs=inputs)
    return {"images": image_statuses, "texts": counts}, record


class _ZeroShot(Endpoint[_Call]):
    """Classify and rank through the request layer, which owns id, clock, trace, metrics and the monitor record.

    Their middle is their own (``run``): images through the intake, texts
    through the segment cache and the text lane, then one matrix product
    (the ``score`` stage). Each image is a row of the trace; the request is
    one latency record under its route label (``classify`` / ``rank``).
    """

    protocol = "native"  # drift attribution counts them with /v1/infer's requests

    @abc.abstractmethod
    def call_of(self, body: bytes, state: ServerState) -> _Call:
        """The checked request (counts first, then the model's score); raises ``ApiError`` naming the field."""

    @abc.abstractmethod
    def pair_matrix(self, score: CalibratedScore, images: list, texts: list) -> np.ndarray:
        """(N, L) scores of the calibrated kind, on the host (runs in the pool: torch stays off the event loop)."""

    @abc.abstractmethod
    def score_kind(self, score: CalibratedScore) -> str:
        """The answer's ``score_kind`` for a calibrated score."""

    @abc.abstractmethod
    def results(self, call: _Call, matrix: np.ndarray) -> list[dict]:
        """The answer's ``results``, best first."""

    async def parse(self, request: Request, state: ServerState) -> Parsed[_Call]:
        call = self.call_of(await request.body(), state)
        body = call.body
        return Parsed(tuple(ParsedInput(None, (content,), body.priority, body.timeout_ms, body.truncate,
                                        body.use_cache) for content in call.images), call)

    async def run(self, parsed: Parsed[_Call], state: ServerState, arrival: Arrival) -> Ran:
        call, encoder = parsed.context, _encoder(state)
        options = ZeroShotOptions(request_id=arrival.request_id, priority=Priority(call.body.priority),
                                  timeout_ms=call.body.timeout_ms, truncate=call.body.truncate,
                                  use_cache=call.body.use_cache, trace=arrival.trace)
        images, texts = await _encode(encoder, call, options, arrival.started_ns)
        (matrix, score_kind), score_ns = await arrival.timed(
            self._scores(encoder, call, images, texts, options, arrival.started_ns))
        cache, record = _request_record(call, images, texts, score_ns)
        outcomes = tuple(RowOutcome(outcome, outcome.result) for outcome in images.outcomes)
        return Ran(outcomes, _Scored(matrix, score_kind, cache), record)

    async def _scores(self, encoder: ZeroShotEncoder, call: _Call, images: EncodedImages, texts: EncodedTexts,
                      options: ZeroShotOptions, arrival_ns: int) -> tuple[np.ndarray, str]:
        """(N, L) scores and their kind: the model's calibrated score, or its trained fusion head's."""
        score = call.scoring.score
        if score is None:
            return await encoder.head_scores(call.images, call.texts, options, arrival_ns), "match_score"
        matrix = await encoder.off_loop(self.pair_matrix, score, [s.pooled for s in images.segments],
                                        [s.pooled for s in texts.segments])
        return matrix, self.score_kind(score)

    def render(self, parsed: Parsed[_Call], answered: Answered, state: ServerState) -> Response:
        scored: _Scored = answered.value
        body = {"id": answered.request_id, "model": state.model_description, "score_kind": scored.score_kind,
                "results": self.results(parsed.context, scored.matrix), "cache": scored.cache,
                "timings_ms": {stage: round(ns / 1e6, 3) for stage, ns in answered.stage_ns().items()}}
        return Response(json_body.dumps(body), media_type="application/json")


# -- POST /v1/classify ------------------------------------------------------------------------------------


class Classify(_ZeroShot):
    """Every image against every label: the model's zero-shot classification pipeline's scores."""

    http_route, metrics_label = "/v1/classify", "classify"

    def call_of(self, body: bytes, state: ServerState) -> _Call:
        request = _validated(ClassifyRequest, body)
        checked = classify_input(request, state.settings)  # type: ignore[arg-type]
        image_field = (lambda i: f"images[{i}]") if checked.images_as_list else (lambda i: "image")
        return _Call(request, checked, _scoring(state), checked.images, checked.texts,  # type: ignore[arg-type]
                     image_field, lambda i: f"labels[{i}]")

    def pair_matrix(self, score: CalibratedScore, images: list, texts: list) -> np.ndarray:
        return classify_scores(score, stack_embeddings(images), stack_embeddings(texts)).numpy()

    def score_kind(self, score: CalibratedScore) -> str:
        return classify_score_kind(score.kind).value

    def results(self, call: _Call, matrix: np.ndarray) -> list[dict]:
        labels = call.checked.labels  # type: ignore[union-attr]
        top_k = call.body.top_k  # type: ignore[union-attr]
        results = []
        for row in matrix.tolist():
            order = best_first(row, top_k)
            results.append({"labels": [{"label": labels[j], "score": row[j]} for j in order]})
        return results


CLASSIFY = Classify()


@router.post(
    "/v1/classify", response_model=ClassifyResponse, responses=_ERROR_RESPONSES,
    summary="Score labels for an image, as the model's zero-shot image classification pipeline does.",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/ClassifyRequest"}}}}},
)
async def classify(request: Request) -> Response:
    return await serve(request, CLASSIFY)


# -- POST /v1/rank ----------------------------------------------------------------------------------------


class Rank(_ZeroShot):
    """Candidates of one modality against a query of the other: the family's per-pair score, best first."""

    http_route, metrics_label = "/v1/rank", "rank"

    def call_of(self, body: bytes, state: ServerState) -> _Call:
        request = _validated(RankRequest, body)
        checked = rank_input(request, state.settings)  # type: ignore[arg-type]
        scoring = _scoring(state)
        if checked.query_text is not None:
            return _Call(request, checked, scoring, checked.candidate_images,  # type: ignore[arg-type]
                         (checked.query_text,), lambda i: f"candidates[{i}]", lambda i: "query")
        return _Call(request, checked, scoring, (checked.query_image,),  # type: ignore[arg-type]
                     checked.candidate_texts, lambda i: "query", lambda i: f"candidates[{i}]")

    def pair_matrix(self, score: CalibratedScore, images: list, texts: list) -> np.ndarray:
        return pair_scores(score, stack_embeddings(images), stack_embeddings(texts)).numpy()

    def score_kind(self, score: CalibratedScore) -> str:
        return score.kind.value

    def results(self, call: _Call, matrix: np.ndarray) -> list[dict]:
        is_text_query = call.checked.query_text is not None  # type: ignore[union-attr]
        flat = (matrix[:, 0] if is_text_query else matrix[0, :]).tolist()  # (candidates,)
        return [{"index": index, "score": flat[index]} for index in best_first(flat, call.body.top_k)]


RANK = Rank()


@router.post(
    "/v1/rank", response_model=RankResponse, responses=_ERROR_RESPONSES,
    summary="Rank candidates of the other modality against a text or image query, best first.",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/RankRequest"}}}}},
)
async def rank(request: Request) -> Response:
    return await serve(request, RANK)


# The route label of each path's requests (also for a body refused before it reaches a route).
METRICS_ROUTES = {endpoint.http_route: endpoint.metrics_label for endpoint in (CLASSIFY, RANK)}
