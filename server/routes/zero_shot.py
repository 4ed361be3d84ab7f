"""``POST /v1/classify`` and ``POST /v1/rank``: zero-shot scores over cached label embeddings.

    body ──check (counts first, the model can score)──> ZeroShotWork ──state.zero_shot.score──> best first
                                                           images, texts, field names   (server.protocols.zero_shot_run)

Scores are the model's own (``models.zero_shot``): classify gives what
transformers' ``zero-shot-image-classification`` pipeline gives (SigLIP's
sigmoid per label, CLIP's softmax over the labels), rank the family's
per-pair score as ``/v1/infer`` does. A model whose only image-text score is
mmserve's fusion head answers with the head's ``match_score`` once the head
is trained, and 422 ``no_calibrated_score`` before: never an uncalibrated
number. Requests count under ``route="classify"`` / ``route="rank"``.

Both are endpoints of the request layer (``server.request_layer``), which
owns the request's id, clock, trace, metrics and monitor record; their own
``run`` step replaces the layer's one intake call with the scorer's middle:
in one process the model's own (``LocalZeroShot``); in an API process of
``--api-workers N`` the engine's, after this process tokenized the texts and
decoded the images (``server.workers.zero_shot_client``). Whether the model
can score is decided from its facts (``state.served_model``), which both
kinds of process hold.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from models.torch_free.ranking import best_first
from monitoring import RequestInputs
from router.image_header import images_encoding, largest_image_pixels
from router.request import Priority
from router.segments import ImageContent
from router.zero_shot import ZeroShotOptions
from server.errors import ERROR_RESPONSE_SCHEMA, ApiError
from server.ingest import json_body
from server.ingest.inputs import ParsedInput
from server.protocols.rows import RowOutcome
from server.protocols.zero_shot_run import Pairing, ZeroShotScorer, ZeroShotScores, ZeroShotWork
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
from server.schemas import error_location
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
        location = error_location(first["loc"])
        raise ApiError(422, "invalid_request", f"{location}: {first['msg']}", location) from e


def _check_can_score(state: ServerState) -> None:
    """422 unless the model has a score this endpoint may answer with (its facts say: any process holds them)."""
    model = getattr(getattr(state.router, "bundle", None), "model", None)  # None in an API process
    if model is not None and getattr(model, "text", None) is None:  # an API process's facts imply a text tower
        raise ApiError(422, "no_text_tower", f"model {state.served_model.name!r} has no text encoder to embed "
                                             "labels with", "model")
    description = state.served_model.description
    if description.score is not None or description.fusion_head == "trained":
        return
    raise ApiError(422, "no_calibrated_score",
                   f"model {state.served_model.name!r} has no calibrated image-text score (family "
                   f"{description.family!r}) and its fusion head is untrained; train one "
                   "(mmserve train-fusion) to classify and rank with its match_score", "model")


def _scorer(state: ServerState) -> ZeroShotScorer:
    if state.zero_shot is None:  # server.app and the API process always build one
        raise RuntimeError("the app's state has no zero-shot scorer")
    return state.zero_shot


@dataclass(frozen=True)
class _Call:
    """A checked classify or rank request: its body, its checked input and its middle's work (no options yet)."""

    body: ClassifyRequest | RankRequest
    checked: ClassifyInput | RankInput
    pairing: Pairing
    images: tuple[ImageContent, ...]
    texts: tuple[str, ...]
    image_field: str  # image i's field in errors, a template (``images[{}]``, ``query``)
    text_field: str

    def work(self, options: ZeroShotOptions) -> ZeroShotWork:
        return ZeroShotWork(self.images, self.texts, None, self.pairing, self.image_field, self.text_field, options)


def _request_record(call: _Call, scores: ZeroShotScores) -> tuple[dict[str, object], RequestRecord]:
    """The answer's ``cache`` field, and the request's latency record (its stages and facts) for the monitor."""
    image_statuses = list(scores.image_statuses)
    text_statuses = [status for status, num in scores.text_statuses.items() for _ in range(num)]
    inputs = RequestInputs.of(
        largest_image_pixels=largest_image_pixels(call.images), image_encoding=images_encoding(call.images),
        num_text_tokens=scores.num_text_tokens, num_images=len(call.images),
        priority=call.body.priority, protocol="native", engine=scores.outcomes[0].engine)
    record = RequestRecord(scores.stage_ns, batch_size=scores.outcomes[0].result.batch_size,
                           cache_hit=cache_hit_of({"images": image_statuses, "texts": text_statuses}), inputs=inputs)
    return {"images": image_statuses, "texts": dict(scores.text_statuses)}, record


@dataclass(frozen=True)
class _Scored:
    """The run's result for ``render``: scores (images x texts), their kind, the answer's ``cache`` field."""

    matrix: np.ndarray  # (N, L)
    score_kind: str
    cache: dict[str, object]


class _ZeroShot(Endpoint[_Call]):
    """Classify and rank through the request layer, which owns id, clock, trace, metrics and the monitor record.

    Their middle is the scorer's (``run``): images through the intake, texts
    through the segment cache and the text lane, then one matrix product
    (the ``score`` stage). Each image is a row of the trace; the request is
    one latency record under its route label (``classify`` / ``rank``).
    """

    protocol = "native"  # drift attribution counts them with /v1/infer's requests

    @abc.abstractmethod
    def call_of(self, body: bytes, state: ServerState) -> _Call:
        """The checked request (counts first, then the model's score); raises ``ApiError`` naming the field."""

    @abc.abstractmethod
    def results(self, call: _Call, matrix: np.ndarray) -> list[dict]:
        """The answer's ``results``, best first."""

    async def parse(self, request: Request, state: ServerState) -> Parsed[_Call]:
        call = self.call_of(await request.body(), state)
        body = call.body
        return Parsed(tuple(ParsedInput(None, (content,), body.priority, body.timeout_ms, body.truncate,
                                        body.use_cache) for content in call.images), call)

    async def run(self, parsed: Parsed[_Call], state: ServerState, arrival: Arrival) -> Ran:
        call = parsed.context
        options = ZeroShotOptions(request_id=arrival.request_id, priority=Priority(call.body.priority),
                                  timeout_ms=call.body.timeout_ms, truncate=call.body.truncate,
                                  use_cache=call.body.use_cache, trace=arrival.trace)
        scores = await _scorer(state).score(call.work(options), arrival.started_ns)
        cache, record = _request_record(call, scores)
        outcomes = tuple(RowOutcome(outcome, outcome.result) for outcome in scores.outcomes)
        return Ran(outcomes, _Scored(scores.matrix, scores.score_kind, cache), record)

    def render(self, parsed: Parsed[_Call], answered: Answered, state: ServerState) -> Response:
        scored: _Scored = answered.value
        body = {"id": answered.request_id, "model": state.model_description_of(answered.outcomes[0].prepared.engine),
                "score_kind": scored.score_kind,
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
        _check_can_score(state)
        return _Call(request, checked, Pairing.CLASSIFY, checked.images, checked.texts,  # type: ignore[arg-type]
                     "images[{}]" if checked.images_as_list else "image", "labels[{}]")

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
        _check_can_score(state)
        if checked.query_text is not None:
            return _Call(request, checked, Pairing.RANK, checked.candidate_images,  # type: ignore[arg-type]
                         (checked.query_text,), "candidates[{}]", "query")
        return _Call(request, checked, Pairing.RANK, (checked.query_image,),  # type: ignore[arg-type]
                     checked.candidate_texts, "query", "candidates[{}]")

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
