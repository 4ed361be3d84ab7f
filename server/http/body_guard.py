"""The request body's limits, in one layer that wraps ``receive``: its size (413) and its deadline (408).

Size. A declared ``Content-Length`` over ``max_body_bytes`` is answered 413
without reading a byte of the body; a chunked (or lying) body is counted as
it streams and cut off as soon as it passes the limit.

Deadline. A client may send its headers and then a byte a second. Without a
limit the handler would wait on that body for as long as the client likes,
holding a connection and a task (never a batch slot: nothing is queued
before the body is whole). Every ``receive`` of the body is bounded by what
is left of ``timeout_s``, counted from the moment the request reached this
layer:

    headers ──> first chunk ... last chunk      complete before t0 + timeout_s: served as usual
                                   t0 + timeout_s ──> 408 body_timeout, Connection: close

Both refusals made while the body streams are raised from ``receive`` as an
``ApiError``, so every protocol's handler answers them in its own error
shape; after a 408 the response gets ``Connection: close`` so the rest of the
body is never read. Once the body is complete, later ``receive`` calls
(waiting for a disconnect) pass straight through.

A client that hangs up halfway through its body gets the same treatment as
one that hangs up while its request is queued: a 499 ``client_disconnected``
(nobody reads it, but it is counted as the client's doing, not as a 500).

One layer rather than one per limit: each layer is another coroutine per
request and another call per ``receive``. Pure ASGI, so it sits in front of
the routes, multipart parsing included.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import ApiError, BodyTooLargeError
from server.http.error_shapes import error_response


class BodyTimeoutError(ApiError):
    def __init__(self, timeout_s: float) -> None:
        super().__init__(408, "body_timeout",
                         f"the request body did not arrive within {timeout_s:g} s (MMSERVE_BODY_TIMEOUT_S)", "body")


class BodyCutOffError(ApiError):
    def __init__(self) -> None:
        super().__init__(499, "client_disconnected", "the client closed the connection before its body was complete",
                         "body")


class BodyGuard:
    def __init__(self, app: ASGIApp, timeout_s: float, max_body_bytes: int | None = None,
                 on_reject: Callable[[str], None] | None = None) -> None:
        """``max_body_bytes``: ``None`` for no size limit. ``on_reject``: called with the path of each
        413 answered before the body is read (a declared length over the limit)."""
        self.app = app
        self.timeout_s = timeout_s
        self.max_body_bytes = max_body_bytes
        self._on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_body_bytes = self.max_body_bytes
        if max_body_bytes is not None:
            declared = _content_length(scope)
            if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
                if self._on_reject is not None:
                    self._on_reject(scope.get("path", ""))
                await error_response(BodyTooLargeError(max_body_bytes), scope.get("path", ""))(scope, receive, send)
                return
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + self.timeout_s
        is_complete = False
        has_timed_out = False
        received_bytes = 0

        async def guarded_receive() -> Message:
            nonlocal is_complete, has_timed_out, received_bytes
            if is_complete:
                return await receive()
            try:
                # A timer on this task, not wait_for: that starts a task of its own for every receive.
                async with asyncio.timeout_at(deadline_s):
                    message = await receive()
            except TimeoutError:
                has_timed_out = True
                raise BodyTimeoutError(self.timeout_s) from None
            if message["type"] == "http.disconnect":
                raise BodyCutOffError()
            if max_body_bytes is not None:
                received_bytes += len(message.get("body", b""))
                if received_bytes > max_body_bytes:
                    raise BodyTooLargeError(max_body_bytes)
            if not message.get("more_body", False):
                is_complete = True
            return message

        async def closing_send(message: Message) -> None:
            if has_timed_out and message["type"] == "http.response.start":
                headers = [(name, value) for name, value in message.get("headers", []) if name != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, guarded_receive, closing_send)


def _content_length(scope: Scope) -> bytes | None:
    """The declared ``Content-Length`` (the last, if repeated), without building a dict of the headers."""
    declared = None
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            declared = value
    return declared
