"""One log line per request: who asked what, how big, how it ended; never what it said.

    request 3f2a... POST /v1/infer -> 200 in 12.3 ms; body 48213 B blake2b-128 9c1e...; answer 2211 B[; key_id 3f1c9a0b2e7d]

The request id is the one the handler put in ``X-Request-ID``, so a line
matches the answer a client holds. The body is identified by its size and a
BLAKE2b digest, computed as the chunks stream past: enough to find a
repeated or poisoned input, while image bytes and texts (which may be
personal data) never reach a log. Query strings are left out for the same
reason. A request made with a configured API key ends with the key's
non-secret id (``server.http.keys``), never the key. Replaces uvicorn's
access log in ``mmserve serve``.

Probes (``/health/*``, ``/metrics``) are logged at DEBUG, not INFO: an
orchestrator asking every second would otherwise fill the log with lines that
say nothing. A request whose line would not be written (its level is off) is
passed straight through, with no digest, no counting and no wrapped callables.
"""

from __future__ import annotations

import hashlib
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.http.keys import SCOPE_KEY_ID

logger = logging.getLogger(__name__)

DIGEST_SIZE_BYTES = 16
PROBE_PATHS = ("/metrics",)
PROBE_PREFIXES = ("/health/",)


def is_probe(path: str) -> bool:
    """A health probe or a metrics scrape: logged at DEBUG."""
    return path in PROBE_PATHS or path.startswith(PROBE_PREFIXES)


class AccessLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        level = logging.DEBUG if is_probe(scope.get("path", "")) else logging.INFO
        if not logger.isEnabledFor(level):
            await self.app(scope, receive, send)
            return
        started_ns = time.perf_counter_ns()
        digest = hashlib.blake2b(digest_size=DIGEST_SIZE_BYTES)
        body_size_bytes = answer_size_bytes = 0
        status = 0
        request_id = "-"

        async def counting_receive() -> Message:
            nonlocal body_size_bytes
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                body_size_bytes += len(chunk)
                digest.update(chunk)
            return message

        async def counting_send(message: Message) -> None:
            nonlocal status, request_id, answer_size_bytes
            if message["type"] == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", []):
                    if name.lower() == b"x-request-id":
                        request_id = value.decode("latin-1")
            elif message["type"] == "http.response.body":
                answer_size_bytes += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counting_receive, counting_send)
        finally:
            body = f"{body_size_bytes} B blake2b-128 {digest.hexdigest()}" if body_size_bytes else "empty"
            key_id = (scope.get("state") or {}).get(SCOPE_KEY_ID)  # set by ApiKeyAuth for a configured key
            logger.log(level, "request %s %s %s -> %s in %.1f ms; body %s; answer %d B%s", request_id,
                        scope.get("method", "-"), scope.get("path", "-"), status or "none",
                        (time.perf_counter_ns() - started_ns) / 1e6, body, answer_size_bytes,
                        "" if key_id is None else f"; key_id {key_id}")
