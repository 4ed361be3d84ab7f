"""API keys in two roles: ``Authorization: Bearer <key>`` checked in front of every route.

Which routes need which role, and what a server without keys allows, is
``server.http.access_policy``; the keys themselves (plain or ``sha256:``
lines, compared as digests in constant time) are ``server.http.keys``.
This layer applies them before a byte of the request body is read:

    401 missing_api_key / invalid_api_key   no key, or one that is not configured (WWW-Authenticate: Bearer)
    403 forbidden                           a valid key without the admin role on an admin route, or an
                                            unkeyed server bound off loopback (field "authorization")

A recognised key's id goes on the ASGI scope (``request.state.mmserve_key_id``)
for the rate limit and anything downstream that wants to name the caller;
the key itself goes nowhere. Each call of an admin route is written to the
audit log (``server.http.audit``) with its outcome. A configured key file
that holds no key stops the server: running open by mistake is worse than
not starting.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import ApiError
from server.http.access_policy import AccessPolicy, Decision, RouteClass
from server.http.audit import INVALID_KEY_ID, NO_KEY_ID, run_audited
from server.http.error_shapes import error_response
from server.http.keys import SCOPE_KEY_ID, ApiKeyConfigError, KeyMatch, KeyRing
from server.settings import Settings

__all__ = ["ApiKeyAuth", "ApiKeyConfigError", "access_policy", "bearer_token", "load_key_ring", "refusal",
           "warn_about_open_routes"]

logger = logging.getLogger(__name__)


def load_key_ring(settings: Settings) -> KeyRing:
    """Every configured key of both roles, as digests; raises ApiKeyConfigError for an unusable file."""
    return KeyRing.from_sources(api_keys=settings.api_keys, api_key_file=settings.api_key_file,
                                admin_api_keys=settings.admin_api_keys,
                                admin_api_key_file=settings.admin_api_key_file)


def access_policy(settings: Settings) -> AccessPolicy:
    return AccessPolicy.for_bind(load_key_ring(settings), host=settings.host,
                                 open_health_and_metrics=settings.open_health_and_metrics,
                                 allow_open_admin=settings.allow_open_admin)


def warn_about_open_routes(policy: AccessPolicy, host: str) -> None:
    """Off loopback, say at start-up which routes anyone reaching the port may call, and which setting closes them."""
    if policy.is_loopback:
        return
    if policy.is_inference_open:
        logger.warning("bound to %s (not loopback) with no inference keys: the inference routes are open to anyone "
                       "who reaches the port; set MMSERVE_API_KEYS or MMSERVE_API_KEY_FILE to require a key", host)
    if policy.is_admin_open:
        logger.warning("bound to %s (not loopback) with MMSERVE_ALLOW_OPEN_ADMIN: the admin routes (DELETE /v1/cache, "
                       "/v1/admin/*, POST /v1/monitoring/baseline) are open to anyone who reaches the port", host)
    elif not policy.keys.has_admin_keys and not policy.keys.has_inference_keys:
        logger.warning("bound to %s (not loopback) with no admin keys: the admin routes answer 403 until "
                       "MMSERVE_ADMIN_API_KEYS or MMSERVE_ADMIN_API_KEY_FILE is set (or --allow-open-admin)", host)


def bearer_token(authorization: bytes) -> bytes:
    """The key of an ``Authorization`` value (HTTP header or gRPC metadata); ``b""`` when it is not ``Bearer <key>``."""
    scheme, _, token = authorization.partition(b" ")
    if scheme.lower() == b"bearer" and token.strip():
        return token.strip()
    return b""


def _presented_key(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers") or []:
        if name == b"authorization":
            return bearer_token(value)
    return None


def refusal(decision: Decision) -> ApiError:
    """The answer to a decision other than ``ALLOW`` (the same for every protocol: gRPC maps its status)."""
    if decision is Decision.MISSING_KEY:
        return ApiError(401, "missing_api_key", "this server needs an API key: send Authorization: Bearer <key>",
                        "authorization")
    if decision is Decision.INVALID_KEY:
        return ApiError(401, "invalid_api_key", "the API key is not valid", "authorization")
    if decision is Decision.NEEDS_ADMIN:
        return ApiError(403, "forbidden", "this route needs a key of the admin role (MMSERVE_ADMIN_API_KEYS or "
                                          "MMSERVE_ADMIN_API_KEY_FILE); the key sent has the inference role",
                        "authorization")
    return ApiError(403, "forbidden", "this route needs a key of the admin role, and this server, bound to a "
                                      "non-loopback address, has none: set MMSERVE_ADMIN_API_KEYS or "
                                      "MMSERVE_ADMIN_API_KEY_FILE (or start it with --allow-open-admin)",
                    "authorization")


class ApiKeyAuth:
    """Pure ASGI, in front of rate limits, body limits and parsing: a refused client sends its body to no one."""

    def __init__(self, app: ASGIApp, policy: AccessPolicy, on_reject: Callable[[str, str], None] | None = None) -> None:
        self.app = app
        self.policy = policy
        self._has_keys = policy.keys.has_inference_keys or policy.keys.has_admin_keys
        self._on_reject = on_reject  # called with the path and status ("401" or "403") of each refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route_class = self.policy.route_class(scope.get("method", "GET"), path)
        if route_class is RouteClass.OPEN:
            await self.app(scope, receive, send)
            return
        presented = _presented_key(scope) if self._has_keys else None
        match: KeyMatch | None = self.policy.keys.match(presented) if presented else None
        if match is not None:
            scope.setdefault("state", {})[SCOPE_KEY_ID] = match.key_id
        decision = self.policy.decide(route_class, presented, match.role if match is not None else None)
        if route_class is RouteClass.ADMIN:
            key_id = match.key_id if match is not None else NO_KEY_ID if presented is None else INVALID_KEY_ID
            await run_audited(functools.partial(self._answer, decision=decision), key_id, scope, receive, send)
        else:
            await self._answer(scope, receive, send, decision=decision)

    async def _answer(self, scope: Scope, receive: Receive, send: Send, *, decision: Decision) -> None:
        if decision is Decision.ALLOW:
            await self.app(scope, receive, send)
            return
        error = refusal(decision)
        if self._on_reject is not None:
            self._on_reject(scope.get("path", ""), str(error.status))
        response = error_response(error, scope.get("path", ""))
        if error.status == 401:
            response.headers["WWW-Authenticate"] = ('Bearer realm="mmserve"' if decision is Decision.MISSING_KEY
                                                    else 'Bearer realm="mmserve", error="invalid_token"')
        await response(scope, receive, send)
