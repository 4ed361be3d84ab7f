"""Optional API keys: ``Authorization: Bearer <key>`` in front of every route but health and metrics.

Keys come from ``api_keys`` (comma-separated) and ``api_key_file`` (one per
line, ``#`` starts a comment); with neither set the server is open, as suits
a loopback or sidecar deployment. With keys:

    /health/*, /v2/health/*, /metrics   open while open_health_and_metrics (default), else need a key
    every other path                    needs a key; the admin routes (/v1/admin/*, DELETE /v1/cache,
                                        /v1/monitoring/*) are never in the open set

A missing or wrong key gets 401 with ``WWW-Authenticate: Bearer`` and the
usual JSON error body, before a byte of the request body is read. The key a
client presents is compared with every configured key by
``hmac.compare_digest``, so neither the time taken nor an early exit tells an
attacker how much of a key was right. A configured key file that holds no
key stops the server: running open by mistake is worse than not starting.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import ApiError
from server.settings import Settings

OPEN_PREFIXES = ("/health/", "/v2/health/")
OPEN_PATHS = frozenset({"/metrics"})


class ApiKeyConfigError(ValueError):
    """The configured keys cannot be used (an unreadable or empty key file)."""


def load_api_keys(settings: Settings) -> tuple[bytes, ...]:
    """Every configured key as UTF-8 bytes; empty when authentication is off."""
    keys = []
    if settings.api_keys is not None:
        keys += [key.strip() for key in settings.api_keys.get_secret_value().split(",")]
    if settings.api_key_file is not None:
        try:
            lines = Path(settings.api_key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ApiKeyConfigError(f"MMSERVE_API_KEY_FILE {settings.api_key_file}: cannot be read: {e}") from e
        from_file = [line.split("#", 1)[0].strip() for line in lines]
        if not any(from_file):
            raise ApiKeyConfigError(f"MMSERVE_API_KEY_FILE {settings.api_key_file} holds no key")
        keys += from_file
    return tuple(key.encode() for key in keys if key)


def is_open_path(path: str) -> bool:
    """Health and metrics: what probes and scrapers reach (never an admin route)."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def is_valid_key(presented: bytes, keys: Sequence[bytes]) -> bool:
    """Constant-time per key, and every key is compared (no early exit on a match)."""
    is_valid = False
    for key in keys:
        is_valid |= hmac.compare_digest(presented, key)
    return is_valid


def _presented_key(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers") or []:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return b""
    return None


class ApiKeyAuth:
    """Pure ASGI, in front of body limits and parsing: a refused client sends its body to no one."""

    def __init__(self, app: ASGIApp, keys: Sequence[bytes], open_health_and_metrics: bool,
                 on_reject: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.keys = tuple(keys)
        self.open_health_and_metrics = open_health_and_metrics
        self._on_reject = on_reject  # called with the path of each refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if self.open_health_and_metrics and is_open_path(path):
            await self.app(scope, receive, send)
            return
        presented = _presented_key(scope)
        if presented and is_valid_key(presented, self.keys):
            await self.app(scope, receive, send)
            return
        if self._on_reject is not None:
            self._on_reject(path)
        if presented is None:
            error = ApiError(401, "missing_api_key", "this server needs an API key: send Authorization: Bearer <key>",
                             "authorization")
            challenge = 'Bearer realm="mmserve"'
        else:
            error = ApiError(401, "invalid_api_key", "the API key is not valid", "authorization")
            challenge = 'Bearer realm="mmserve", error="invalid_token"'
        response = error.response()
        response.headers["WWW-Authenticate"] = challenge
        await response(scope, receive, send)
