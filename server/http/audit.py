"""The audit log: one line per call of an admin route, whoever made it and however it ended.

    audit key_id=3f1c9a0b2e7d route=DELETE /v1/cache outcome=200 time=2026-12-03T08:41:07.512Z client=10.0.0.7

``key_id`` is the caller's key id (a 12-hex-digit SHA-256 prefix, see
``server.http.keys``), ``none`` when no key was sent and ``invalid`` when the
key is not configured (a wrong key is never digested into a log). ``outcome``
is the answer's status, refusals (401, 403) included, so an operator sees who
tried as well as who did. The line goes to the ``mmserve.audit`` logger at
INFO, so it can be routed on its own; ``time`` is in the message too, so the
line stands alone whatever the log format.

``log_admin_call`` writes one line whatever protocol carried the call: HTTP
through ``run_audited`` (``route=DELETE /v1/cache``), gRPC from its service
(``route=gRPC inference.GRPCInferenceService/RepositoryModelLoad``, outcome
the HTTP status of the answer's gRPC code: 403, 429, 501 for UNIMPLEMENTED).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.http.rate_limit import client_address

logger = logging.getLogger("mmserve.audit")

NO_KEY_ID = "none"
INVALID_KEY_ID = "invalid"


def audit_line(key_id: str, method: str, path: str, status: int | str, client: str, now: datetime) -> str:
    stamp = now.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"audit key_id={key_id} route={method} {path} outcome={status} time={stamp} client={client}"


def log_admin_call(key_id: str, method: str, path: str, status: int | str, client: str) -> None:
    """The audit line of one admin call, now, whichever protocol carried it."""
    logger.info(audit_line(key_id, method, path, status, client, datetime.now(timezone.utc)))


async def run_audited(app: ASGIApp, key_id: str, scope: Scope, receive: Receive, send: Send) -> None:
    """Run ``app`` for an admin route and log its audit line once the answer has started (or failed)."""
    status: int | str = "none"

    async def recording_send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    try:
        await app(scope, receive, recording_send)
    except BaseException:
        if status == "none":
            status = 500
        raise
    finally:
        log_admin_call(key_id, scope.get("method", "-"), scope.get("path", "-"), status, client_address(scope))
