"""415 for a body in a media type its protocol does not speak, before the body is read.

``/v1/infer`` decides for itself (JSON or multipart pick different parsers).
The other routes take one kind of body each:

    POST /v1/classify, /v1/rank    application/json               no Content-Type: 415, as /v1/infer
    POST /v1/embeddings            application/json               no Content-Type: read as JSON
    POST /v2/models/.../infer      application/json,              no Content-Type: read as JSON (or as
                                   application/octet-stream       binary tensor data after its JSON header)

A request without ``Content-Type`` gets what a user of each protocol's own
server gets: Triton reads the body whatever its type (tritonclient sends
none), the OpenAI-compatible servers built on FastAPI (vLLM, Infinity) read a
body without a type as JSON, and the body's own parser still refuses what is
not JSON. mmserve's own routes refuse it, as ``/v1/infer`` always has: ``curl
-d`` sends form-urlencoded, and a body of no declared type is a client's
mistake worth naming.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import ApiError
from server.http.error_shapes import error_response


@dataclass(frozen=True)
class BodyTypes:
    """The media types a route's body may have, and whether a body without ``Content-Type`` is refused."""

    types: frozenset[str]
    is_type_required: bool


JSON_ONLY = BodyTypes(frozenset({"application/json"}), is_type_required=True)
EMBEDDINGS_TYPES = BodyTypes(frozenset({"application/json"}), is_type_required=False)
V2_INFER_TYPES = BodyTypes(frozenset({"application/json", "application/octet-stream"}), is_type_required=False)
_JSON_ONLY_PATHS = frozenset({"/v1/classify", "/v1/rank"})


def accepted_types(method: str, path: str) -> BodyTypes | None:
    """The media types a route's body may have; ``None``: not checked here."""
    if method != "POST":
        return None
    if path in _JSON_ONLY_PATHS:
        return JSON_ONLY
    if path == "/v1/embeddings":
        return EMBEDDINGS_TYPES
    if path.startswith("/v2/models/") and path.endswith("/infer"):
        return V2_INFER_TYPES
    return None


def _media_type(scope: Scope) -> str | None:
    for name, value in scope.get("headers") or []:
        if name == b"content-type":
            return value.decode("latin-1").split(";")[0].strip().lower()
    return None


def _is_refused(media_type: str | None, accepted: BodyTypes) -> bool:
    if media_type is None:
        return accepted.is_type_required
    return media_type not in accepted.types


class ContentTypeCheck:
    def __init__(self, app: ASGIApp, on_reject: Callable[[str], None] | None = None) -> None:
        self.app = app
        self._on_reject = on_reject  # called with the path of each refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            accepted = accepted_types(scope.get("method", ""), scope.get("path", ""))
            media_type = _media_type(scope)
            if accepted is not None and _is_refused(media_type, accepted):
                if self._on_reject is not None:
                    self._on_reject(scope.get("path", ""))
                named = "(none)" if media_type is None else media_type or "(empty)"
                error = ApiError(415, "unsupported_media_type",
                                 f"content type {named!r} is not accepted here; send "
                                 f"{' or '.join(sorted(accepted.types))}", "content-type")
                await error_response(error, scope.get("path", ""))(scope, receive, send)
                return
        await self.app(scope, receive, send)
