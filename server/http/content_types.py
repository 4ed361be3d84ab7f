"""415 for a body in a media type its protocol does not speak, before the body is read.

``/v1/infer`` decides for itself (JSON or multipart pick different parsers).
The protocol routes take one kind of body each:

    POST /v1/embeddings            application/json
    POST /v2/models/.../infer      application/json, application/octet-stream (binary tensor data)

A request without ``Content-Type`` is let through: tritonclient sends none,
and the body's own parser still refuses what is not JSON.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import ApiError

EMBEDDINGS_TYPES = frozenset({"application/json"})
V2_INFER_TYPES = frozenset({"application/json", "application/octet-stream"})


def accepted_types(method: str, path: str) -> frozenset[str] | None:
    """The media types a route's body may have; ``None``: not checked here."""
    if method != "POST":
        return None
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


class ContentTypeCheck:
    def __init__(self, app: ASGIApp, on_reject: Callable[[str], None] | None = None) -> None:
        self.app = app
        self._on_reject = on_reject  # called with the path of each refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            accepted = accepted_types(scope.get("method", ""), scope.get("path", ""))
            media_type = _media_type(scope)
            if accepted is not None and media_type is not None and media_type not in accepted:
                if self._on_reject is not None:
                    self._on_reject(scope.get("path", ""))
                error = ApiError(415, "unsupported_media_type",
                                 f"content type {media_type or '(empty)'!r} is not accepted here; send "
                                 f"{' or '.join(sorted(accepted))}", "content-type")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
