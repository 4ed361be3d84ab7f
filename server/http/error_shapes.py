"""The error shape of the protocol a path belongs to, for answers made before any route runs.

The guards (keys and roles, the rate limit, body limits, content types) and
routing (404, 405) answer before a route's own error rendering, so they take
the shape from the path here, and a protocol's clients read every answer
they can get on its paths:

    /v2, /v2/...      KServe v2   {"error": "missing_api_key: ..."}             tritonclient reads "error" as a
                                                                              string; an object breaks its
                                                                              exception's text
    /v1/embeddings,   OpenAI      {"error": {"message", "type", "param", "code"}}   the openai client reads
    /v1/models[/...]                                                              code and param from it
    anything else     mmserve     {"error": {"code", "message", "field"}}

Once they run, the v2 and OpenAI routes render their own errors in the same
shapes (``server.routes.v2``, ``server.routes.openai``).
"""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from server.errors import ApiError
from server.protocols import kserve_v2_model, openai_embeddings
from server.schemas import error_location

KSERVE_V2_ROOT = "/v2"
OPENAI_PATHS = frozenset({"/v1/embeddings", "/v1/models"})
OPENAI_MODEL_PREFIX = "/v1/models/"  # /v1/models/{id}: a model id may hold slashes (a Hub id)


def error_response(error: ApiError, path: str) -> JSONResponse:
    """``error``'s answer (its status and headers) in the shape of ``path``'s protocol."""
    if path == KSERVE_V2_ROOT or path.startswith(KSERVE_V2_ROOT + "/"):
        return error.response(kserve_v2_model.error_body(error))
    # an OpenAI client's typo, bad key or wrong method gets the error its client reads
    if path.rstrip("/") in OPENAI_PATHS or path.startswith(OPENAI_MODEL_PREFIX):
        return error.response(openai_embeddings.error_body(error, error.field))
    return error.response()


def validation_error(error: RequestValidationError) -> ApiError:
    """A body or query FastAPI refused before the route ran (a route that declares a pydantic body:
    ``POST /v1/admin/faults``) as every route refuses one: 400 ``invalid_json``, or 422 ``invalid_request``
    naming the field, not FastAPI's ``{"detail": [...]}``."""
    first = error.errors()[0] if error.errors() else {"loc": (), "msg": "invalid request", "type": ""}
    location = tuple(first["loc"])
    if location[:1] in (("body",), ("query",), ("path",)):
        location = location[1:]
    if first["type"] == "json_invalid":
        message = first.get("ctx", {}).get("error", first["msg"])
        return ApiError(400, "invalid_json", f"body is not valid JSON: {message}", "body")
    field = error_location(tuple(part for part in location if isinstance(part, (int, str))))
    return ApiError(422, "invalid_request", f"{field}: {first['msg']}", field)
