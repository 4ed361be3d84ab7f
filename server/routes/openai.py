"""OpenAI-compatible ``POST /v1/embeddings`` and ``GET /v1/models``.

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``,
with the status and named ``code`` that ``/v1/infer`` gives the same cause;
``param`` names the offending item as ``input[i]`` (``input`` for a single
string). Requests count in ``mmserve_requests_total{route="openai"}``: one
request may mix text and image items, so it gets its own label instead of
skewing a lane's latency histogram.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server.errors import ApiError
from server.ingest import json_body
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
from server.protocols.rows import Failure
from server.request_layer import Answered, Endpoint, Parsed, serve
from server.state import ServerState

router = APIRouter(tags=["OpenAI-compatible"])

METRICS_ROUTE = "openai"
_REQUEST_FIELDS = frozenset(EmbeddingsRequest.model_fields) - {"input"}  # the body's fields but the items


def _error_response(failure: Failure, is_single_input: bool) -> JSONResponse:
    """OpenAI's error; ``param`` names the item for an item's error, and the request's own field (its
    ``timeout_ms`` for a passed deadline, met by whichever item) for an error about that field."""
    error = failure.error
    if failure.row_index is not None and error.field not in _REQUEST_FIELDS:
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
    card = model_card(state.served_model.name, _created_unix_s(request), _with_engines(state))
    return JSONResponse({"object": "list", "data": [card]})


@router.get("/v1/models/{model_id:path}", summary="One model, as OpenAI's model object.")
async def retrieve_model(request: Request, model_id: str) -> JSONResponse:
    state: ServerState = request.app.state.mmserve
    try:
        check_model(model_id, state.served_names)
    except ApiError as e:
        return _error_response(Failure(e, None), is_single_input=False)
    return JSONResponse(model_card(model_id, _created_unix_s(request), _with_engines(state)))


def _with_engines(state: ServerState) -> dict:
    """The model's description and the engines that serve it (``engine``, ``serving``): what an answer's
    ``model.engine`` names."""
    return {**state.model_description, "engines": state.router.engine_states()}


class Embeddings(Endpoint[EmbeddingsRequest]):
    """``/v1/embeddings``: each input is an item; ``param`` names the bad one as ``input[i]``."""

    http_route = "/v1/embeddings"
    metrics_label = METRICS_ROUTE
    protocol = "openai"
    rows_field = "input"

    async def parse(self, request: Request, state: ServerState) -> Parsed[EmbeddingsRequest]:
        embeddings_request = parse_embeddings_request(await request.body())
        check_model(embeddings_request.model, state.served_names)
        return Parsed(items_from_request(embeddings_request, state.settings), embeddings_request)

    def check(self, parsed: Parsed[EmbeddingsRequest], state: ServerState) -> None:
        check_dimensions(parsed.context, parsed.items, state.served_model)

    def render(self, parsed: Parsed[EmbeddingsRequest], answered: Answered, state: ServerState) -> Response:
        # orjson (server/ingest/json_body.py): the standard library's encoder took a tenth of a text answer's GIL time.
        body = json_body.dumps(embeddings_response(parsed.context, state.served_model.name, answered.outcomes))
        return Response(body, media_type="application/json")

    def render_error(self, failure: Failure, parsed: Parsed[EmbeddingsRequest] | None) -> Response:
        is_single_input = parsed is not None and isinstance(parsed.context.input, str)
        return _error_response(failure, is_single_input)


ENDPOINT = Embeddings()


@router.post(
    "/v1/embeddings",
    summary="Embed texts and images (data:image/... URIs), OpenAI-style.",
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": EmbeddingsRequest.model_json_schema()}}}},
)
async def embeddings(request: Request) -> Response:
    return await serve(request, ENDPOINT)
