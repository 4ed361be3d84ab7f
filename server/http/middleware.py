"""The ASGI layers in front of the routes, and their order (outermost first).

    AccessLog         one line per request (id, sizes, digest), whatever happened inside
    CORS              only when cors_origins is set; answers preflights itself
    ApiKeyAuth        401 before a byte of the body is read
    ContentTypeCheck  415 for the protocol routes (/v1/infer checks its own)
    BodyTimeout       408 for a body that trickles (499 for one cut off)
    BodySizeLimit     413 for a body over the limit (added by ``create_app``, innermost)

Starlette runs the middleware added last first, so ``add_request_guards`` adds
them innermost-first, after ``BodySizeLimit``. Refusals made here use the JSON
error shape of ``/v1/infer`` whatever the protocol, as ``BodySizeLimit`` does.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from server.http.access_log import AccessLog
from server.http.auth import ApiKeyAuth, load_api_keys
from server.http.body_timeout import BodyTimeout
from server.http.content_types import ContentTypeCheck
from server.settings import Settings

CORS_METHODS = ("GET", "POST", "DELETE", "OPTIONS")
CORS_REQUEST_HEADERS = ("authorization", "content-type", "inference-header-content-length")
CORS_EXPOSED_HEADERS = ("x-request-id", "retry-after", "inference-header-content-length")


def cors_origins(settings: Settings) -> list[str]:
    if settings.cors_origins is None:
        return []
    return [origin.strip() for origin in settings.cors_origins.split(",") if origin.strip()]


def add_request_guards(app: FastAPI, settings: Settings,
                       count_rejection: Callable[[str, str], None] | None = None) -> None:
    """Add the layers above; ``count_rejection(path, status)`` counts a 401 or 415 in the request metrics."""
    app.add_middleware(BodyTimeout, timeout_s=settings.body_timeout_s)
    app.add_middleware(ContentTypeCheck,
                       on_reject=None if count_rejection is None else (lambda path: count_rejection(path, "415")))
    app.add_middleware(
        ApiKeyAuth, keys=load_api_keys(settings), open_health_and_metrics=settings.open_health_and_metrics,
        on_reject=None if count_rejection is None else (lambda path: count_rejection(path, "401")),
    )
    origins = cors_origins(settings)
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=list(CORS_METHODS),
                           allow_headers=list(CORS_REQUEST_HEADERS), expose_headers=list(CORS_EXPOSED_HEADERS))
    app.add_middleware(AccessLog)
