"""The ASGI layers in front of the routes, and their order (outermost first).

    AccessLog         one line per request (id, sizes, digest), whatever happened inside
    CORS              only when cors_origins is set; answers preflights itself
    ApiKeyAuth        401/403 before a byte of the body is read; audits admin calls; puts the key id on the scope
    RateLimit         429 + Retry-After per key (per address without one), only when rate_limit is set
    ContentTypeCheck  415 for the protocol routes (/v1/infer checks its own)
    BodyGuard         413 for a body over the limit, 408 for one that trickles (499 for one cut off)

Starlette runs the middleware added last first, so ``add_request_guards`` adds
them innermost-first. Refusals made here use the JSON error shape of
``/v1/infer`` whatever the protocol. ``BodyGuard`` refuses a body while it
streams by raising from ``receive``; a route that declares its body as a FastAPI
parameter (``POST /v1/admin/faults``) has it read by FastAPI, which turns any
such exception into a 400 "error parsing the body", so the app answers that
400 with the guard's own refusal (408, 413, 499) instead, as every other route
does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from server.errors import ApiError
from server.http.access_log import AccessLog
from server.http.access_policy import AccessPolicy
from server.http.auth import ApiKeyAuth, access_policy, warn_about_open_routes
from server.http.body_guard import BodyGuard
from server.http.content_types import ContentTypeCheck
from server.http.error_shapes import error_response
from server.http.rate_limit import (
    InProcessTokenBuckets,
    RateLimit,
    RateLimiter,
    RateLimitMiddleware,
    TokenBucketStore,
)
from server.settings import Settings

CORS_METHODS = ("GET", "POST", "DELETE", "OPTIONS")
CORS_REQUEST_HEADERS = ("authorization", "content-type", "inference-header-content-length")
CORS_EXPOSED_HEADERS = ("x-request-id", "retry-after", "inference-header-content-length")


def cors_origins(settings: Settings) -> list[str]:
    if settings.cors_origins is None:
        return []
    return [origin.strip() for origin in settings.cors_origins.split(",") if origin.strip()]


@dataclass(frozen=True)
class RequestGuards:
    """The guards' state, one per app: what gRPC (``server.grpc.guards``) applies to its calls as HTTP does."""

    policy: AccessPolicy
    limiter: RateLimiter | None  # None without a rate limit


def add_request_guards(app: FastAPI, settings: Settings,
                       count_rejection: Callable[[str, str], None] | None = None,
                       registry: CollectorRegistry | None = None,
                       rate_buckets: TokenBucketStore | None = None) -> RequestGuards:
    """Add the layers above; ``count_rejection(path, status)`` counts a 401, 403, 413, 415 or 429 in the request
    metrics.

    ``registry``: where ``mmserve_rate_limited_total`` is exported (the app's own).
    ``rate_buckets``: where the buckets live when rate_limit is set; this process's memory unless given
    (API processes pass the table they share, ``server.workers.shared_rate_buckets``).
    Returns the policy and limiter the layers use, for other protocols of the same app.
    """
    app.add_middleware(BodyGuard, timeout_s=settings.body_timeout_s, max_body_bytes=settings.max_body_bytes,
                       on_reject=None if count_rejection is None else (lambda path: count_rejection(path, "413")))
    app.add_middleware(ContentTypeCheck,
                       on_reject=None if count_rejection is None else (lambda path: count_rejection(path, "415")))
    limiter = None
    if settings.rate_limit is not None:
        limit = RateLimit.parse(settings.rate_limit)
        store = rate_buckets if rate_buckets is not None else InProcessTokenBuckets(limit)
        limiter = RateLimiter(store, registry, limit_text=str(limit))
        app.add_middleware(RateLimitMiddleware, limiter=limiter,
                           on_reject=None if count_rejection is None else (lambda path: count_rejection(path, "429")))
    policy = access_policy(settings)
    warn_about_open_routes(policy, settings.host)
    app.add_middleware(ApiKeyAuth, policy=policy, on_reject=count_rejection)
    origins = cors_origins(settings)
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=list(CORS_METHODS),
                           allow_headers=list(CORS_REQUEST_HEADERS), expose_headers=list(CORS_EXPOSED_HEADERS))
    app.add_middleware(AccessLog)
    app.add_exception_handler(HTTPException, answer_guard_refusals)
    return RequestGuards(policy, limiter)


async def answer_guard_refusals(request: Request, error: HTTPException) -> Response:
    """FastAPI's answer to an ``HTTPException``, unless it wraps a guard's refusal raised from ``receive``, or
    is routing's 404 or 405: those get the error shape of the path's protocol (``server.http.error_shapes``;
    a 405 keeps the ``Allow`` header routing set)."""
    path = request.url.path
    if isinstance(error.__cause__, ApiError):  # FastAPI's body parsing: "raise HTTPException(400) from e"
        return error_response(error.__cause__, path)
    if error.status_code == 404:
        return error_response(ApiError(404, "route_not_found", f"no route {request.method} {path} (the routes are "
                                       "listed at /docs)"), path)
    if error.status_code == 405:
        allowed = (error.headers or {}).get("Allow", "")
        response = error_response(ApiError(405, "method_not_allowed", f"{request.method} is not allowed on {path}; "
                                           f"this route takes {allowed or 'other methods'}", "method"), path)
        response.headers.update(error.headers or {})
        return response
    return await http_exception_handler(request, error)
