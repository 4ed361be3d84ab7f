"""``POST /v1/infer``: the native API (JSON or multipart), one item per request.

The route parses the body and renders the answer; the request layer
(``server.request_layer``) does the rest, as for every protocol.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from router.intake import IntakeOutcome
from server.errors import ERROR_RESPONSE_SCHEMA, ApiError
from server.ingest import json_body
from server.ingest.inputs import ParsedInput, parse_json, parse_multipart
from server.request_layer import Answered, Endpoint, Parsed, serve
from server.schemas import InferResponse
from server.state import ServerState

router = APIRouter()

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


def _ms(nanoseconds: int) -> float:
    return round(nanoseconds / 1e6, 3)


def _response_body(request_id: str, state: ServerState, prepared: IntakeOutcome, images_as_list: bool) -> dict:
    """Everything but ``timings_ms``, which is added once the body is built.

    A request that sent ``images`` gets ``image_embeddings`` and a per-image
    ``cache.images``; one that sent ``image`` gets ``image_embedding`` and
    ``cache.image``, as before multi-image requests existed.
    """
    result = prepared.result
    body: dict = {
        "id": request_id,
        "route": result.route.value,
        "model": state.model_description_of(prepared.engine),
    }
    if images_as_list:
        body["image_embeddings"] = list(result.image_embeddings)
    for key, value in (
        ("image_embedding", result.image_embeddings[0] if result.image_embeddings and not images_as_list else None),
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
    body["cache"] = prepared.cache
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


class NativeInfer(Endpoint[None]):
    """``/v1/infer``: one item per request, counted under its lane (``invalid`` when it cannot be parsed)."""

    http_route = "/v1/infer"
    metrics_label = "invalid"
    protocol = "native"
    is_rows = False

    async def parse(self, request: Request, state: ServerState) -> Parsed[None]:
        return Parsed((await _parse(request, state),), None)

    def render(self, parsed: Parsed[None], answered: Answered, state: ServerState) -> Response:
        body = _response_body(answered.request_id, state, answered.outcomes[0].prepared,
                              parsed.items[0].images_as_list)
        body["timings_ms"] = {stage: _ms(ns) for stage, ns in answered.stage_ns().items()}
        return Response(json_body.dumps(body), media_type="application/json")

    def metrics_route(self, parsed: Parsed[None] | None) -> str:
        return parsed.items[0].route if parsed is not None else self.metrics_label


ENDPOINT = NativeInfer()


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
    return await serve(request, ENDPOINT)
