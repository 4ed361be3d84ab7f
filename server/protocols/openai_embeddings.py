"""OpenAI-compatible embeddings: ``POST /v1/embeddings`` bodies -> rows -> answers.

    {"model": "tiny", "input": ["a red bicycle", "data:image/png;base64,iVBORw0KG..."],
     "encoding_format": "float" | "base64"}

Each string of ``input`` is one item: a ``data:image/...;base64,`` URI is an
image and gets its image embedding; any other string is a text and gets its
text embedding. ``model`` must be the served model's name (``GET /v1/models``
lists it) or be left out. Remote images (``http(s)://`` URLs) are always
refused: the server fetches nothing on a client's behalf. ``base64`` is each
vector's little-endian float32 bytes, as OpenAI sends them (the ``openai``
client asks for it unless told otherwise). ``usage`` counts text tokens
(special tokens included); image items count none. ``dimensions`` is
accepted only when it equals every item's native size: these embeddings are
not trained to be truncated. ``truncate`` is mmserve's own field, as on
``/v1/infer``: ``true`` cuts a text over the model's token limit to the limit
instead of refusing it (OpenAI's API has no such field; without it a long text
could not be embedded here at all). ``timeout_ms`` is mmserve's too: the
request's deadline from arrival, as on ``/v1/infer``; a 504 names it, so a
client told to set it can.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from models.served_facts import ServedModelFacts
from server.protocols.model_names import ServedModelNames
from server.ingest import json_body
from server.ingest.decoding import decode_base64
from server.errors import ApiError
from server.ingest.inputs import ParsedInput, image_content, parsed_input
from server.protocols.errors import RowFailedError
from server.protocols.rows import RowOutcome
from server.schemas import TIMEOUT_MS_LIMIT, WholeInt
from server.settings import Settings

_DATA_URI = re.compile(r"data:(?P<media_type>[^;,]*)(?P<parameters>(?:;[^;,]*)*),(?P<payload>.*)",
                       re.DOTALL | re.IGNORECASE)  # the scheme, type and "base64" in any case (RFC 2397, 2045)
_DATA_URI_START = re.compile(r"data:[\w.+-]+/[\w.+-]+[;,]", re.IGNORECASE)
_REMOTE_URL = re.compile(r"https?://\S+", re.IGNORECASE)
OWNER = "mmserve"


class EmbeddingsRequest(BaseModel):
    """Body of ``POST /v1/embeddings`` (OpenAI's fields; ``user`` is accepted and ignored)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    input: str | list[str] = Field(description="A string or a list: texts, and images as data:image/... URIs.")
    model: str | None = Field(None, description="The served model's name; may be left out.")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, description="Must equal each item's embedding size if given.")
    user: str | None = None
    truncate: bool = Field(False, description="mmserve's extension: cut a text over the model's token limit to "
                                              "the limit instead of refusing it, as on /v1/infer.")
    timeout_ms: WholeInt | None = Field(None, ge=1, le=TIMEOUT_MS_LIMIT,
                                        description="mmserve's extension: the deadline from arrival, as on /v1/infer.")


def _validation_error(error: ValidationError) -> ApiError:
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"]) or "body"
    return ApiError(422, "invalid_request", f"{location}: {first['msg']}", location.split(".")[0])


def parse_embeddings_request(body: bytes) -> EmbeddingsRequest:
    """JSON -> ``EmbeddingsRequest``; token-id inputs get their own clear refusal."""
    try:
        document = json_body.loads(body)
    except (json_body.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, "invalid_json", f"body is not valid JSON: {e}", "body") from e
    raw_input = document.get("input") if isinstance(document, dict) else None
    if isinstance(raw_input, list) and any(isinstance(item, (int, list)) for item in raw_input):
        raise ApiError(422, "token_input_not_supported",
                       "input holds token ids; this server tokenizes with its own model, send strings", "input")
    _check_input_type(raw_input)
    try:
        request = EmbeddingsRequest.model_validate(document)
    except ValidationError as e:
        raise _validation_error(e) from e
    if isinstance(request.input, list) and not request.input:
        raise ApiError(422, "empty_request", "input is an empty list", "input")
    return request


def _check_input_type(raw_input: object) -> None:
    """``input`` that is neither a string nor a list of strings is named plainly (pydantic's union error
    read "input.str: Input should be a valid string" for a list holding a null)."""
    if raw_input is None or isinstance(raw_input, str):
        return  # a missing input is pydantic's "Field required"
    wanted = "a string or a list of strings (texts, and images as data:image/...;base64,... URIs)"
    if not isinstance(raw_input, list):
        raise ApiError(422, "invalid_request", f"input must be {wanted}, not {type(raw_input).__name__}", "input")
    for row_index, item in enumerate(raw_input):
        if not isinstance(item, str):
            raise ApiError(422, "invalid_request", f"input[{row_index}] must be a string, not "
                           f"{'null' if item is None else type(item).__name__}; input is {wanted}",
                           f"input[{row_index}]")


def check_model(requested: str | None, names: ServedModelNames) -> None:
    """``model`` may be left out, or name the model as served or as given to ``--model`` (``model_names``)."""
    if requested is not None and not names.accepts(requested):
        raise ApiError(404, "model_not_found", f"the model {requested!r} does not exist here; this server serves "
                       f"{names.described()}", "model")


def _image_from_data_uri(value: str) -> bytes:
    match = _DATA_URI.fullmatch(value)
    if match is None:
        raise ApiError(400, "invalid_data_uri", "a data URI must look like data:image/png;base64,<data>", "input")
    media_type = match["media_type"].strip().lower()
    if not media_type.startswith("image/"):
        raise ApiError(415, "unsupported_media_type",
                       f"data URI media type {media_type or '(none)'!r} is not image/*", "input")
    if "base64" not in (part.strip().lower() for part in match["parameters"].split(";")):
        raise ApiError(400, "invalid_data_uri", "an image data URI must be base64 (data:image/...;base64,...)",
                       "input")
    return decode_base64(match["payload"], "input")


def item_from_string(value: str, settings: Settings, truncate: bool = False,
                     timeout_ms: int | None = None) -> ParsedInput:
    """A data URI is an image, an http(s) URL is refused, anything else is text.

    Only a string that starts like a data URI (``data:type/subtype,`` or ``;``)
    is read as one, so a text such as "data: see table 2" stays a text.
    """
    if _DATA_URI_START.match(value):
        return parsed_input(None, image_content(_image_from_data_uri(value), None), settings, timeout_ms=timeout_ms)
    if _REMOTE_URL.fullmatch(value.strip()):
        raise ApiError(400, "remote_image_refused",
                       "this server does not fetch URLs; send the image inline as data:image/...;base64,<data>",
                       "input")
    return parsed_input(value, (), settings, truncate=truncate, timeout_ms=timeout_ms)


def items_from_request(request: EmbeddingsRequest, settings: Settings) -> list[ParsedInput]:
    """One ``ParsedInput`` per item, checked like ``/v1/infer``; ``RowFailedError`` names a bad item."""
    if isinstance(request.input, str):  # one item: its errors name "input" itself, as the intake's do
        try:
            return [item_from_string(request.input, settings, request.truncate, request.timeout_ms)]
        except ApiError as e:
            raise ApiError(e.status, e.code, e.message, "input", e.retry_after_s) from e
    items = []
    for row_index, value in enumerate(request.input):
        try:
            items.append(item_from_string(value, settings, request.truncate, request.timeout_ms))
        except ApiError as e:
            raise RowFailedError(row_index, e) from e
    return items


def check_dimensions(request: EmbeddingsRequest, items: Sequence[ParsedInput], model: ServedModelFacts) -> None:
    if request.dimensions is None:
        return
    sizes = {model.text_embedding_dim if item.route == "text" else model.image_embedding_dim
             for item in items}
    if sizes != {request.dimensions}:
        raise ApiError(422, "unsupported_dimensions",
                       f"dimensions={request.dimensions} is not available; these items embed to "
                       f"{sorted(sizes)} dimensions (leave dimensions out)", "dimensions")


def _vector(outcome: RowOutcome) -> np.ndarray:
    result = outcome.result
    vector = result.text_embedding if result.image_embedding is None else result.image_embedding
    return np.asarray(vector, dtype="<f4")  # (D,)


def embeddings_response(request: EmbeddingsRequest, model_name: str, outcomes: Sequence[RowOutcome]) -> dict:
    """OpenAI's ``CreateEmbeddingResponse``: one entry per item, in input order."""
    data = []
    for index, outcome in enumerate(outcomes):
        vector = _vector(outcome)
        embedding: list[float] | str = (
            base64.b64encode(vector.tobytes()).decode() if request.encoding_format == "base64" else vector.tolist()
        )
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    num_tokens = sum(len(o.prepared.text.token_ids) for o in outcomes if o.prepared.text is not None)
    return {"object": "list", "data": data, "model": model_name,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}


def model_card(model_name: str, created_unix_s: int, description: dict | None = None) -> dict:
    """OpenAI's model object; ``description`` (family, score, normalisation, head) rides along as ``mmserve``."""
    card = {"id": model_name, "object": "model", "created": created_unix_s, "owned_by": OWNER}
    if description is not None:
        card["mmserve"] = description
    return card


def error_body(error: ApiError, param: str | None) -> dict:
    """OpenAI's error shape; ``code`` is the same named code ``/v1/infer`` uses."""
    kind = "invalid_request_error" if error.status < 500 else "server_error"
    return {"error": {"message": error.message, "type": kind, "param": param, "code": error.code}}
