"""Refuse oversized bodies before they are read whole.

A declared ``Content-Length`` over the limit is answered 413 without reading a
byte of the body; a chunked (or lying) body is counted as it streams and cut
off as soon as it passes the limit. Pure ASGI so it sits in front of
everything, multipart parsing included.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import BodyTooLargeError


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_body_bytes: int,
                 on_reject: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self._on_reject = on_reject  # called with the path of each early refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            if self._on_reject is not None:
                self._on_reject(scope.get("path", ""))
            await BodyTooLargeError(self.max_body_bytes).response()(scope, receive, send)
            return

        received_bytes = 0

        async def limited_receive() -> Message:
            nonlocal received_bytes
            message = await receive()
            if message["type"] == "http.request":
                received_bytes += len(message.get("body", b""))
                if received_bytes > self.max_body_bytes:
                    raise BodyTooLargeError(self.max_body_bytes)
            return message

        await self.app(scope, limited_receive, send)
