"""408 for a request body that does not arrive in time, so a trickling client holds nothing.

A client may send its headers and then a byte a second. Without a limit the
handler would wait on that body for as long as the client likes, holding a
connection and a task (never a batch slot: nothing is queued before the body
is whole). Every ``receive`` of the body is bounded by what is left of
``timeout_s``, counted from the moment the request reached the app:

    headers ──> first chunk ... last chunk      complete before t0 + timeout_s: served as usual
                                   t0 + timeout_s ──> 408 body_timeout, Connection: close

The refusal is raised from ``receive`` as an ``ApiError`` so every protocol's
handler answers it in its own error shape; the response gets
``Connection: close`` so the rest of the body is never read. Once the body is
complete, later ``receive`` calls (waiting for a disconnect) are not bounded.

A client that hangs up halfway through its body gets the same treatment as
one that hangs up while its request is queued: a 499 ``client_disconnected``
(nobody reads it, but it is counted as the client's doing, not as a 500).
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import ApiError


class BodyTimeoutError(ApiError):
    def __init__(self, timeout_s: float) -> None:
        super().__init__(408, "body_timeout",
                         f"the request body did not arrive within {timeout_s:g} s (MMSERVE_BODY_TIMEOUT_S)", "body")


class BodyCutOffError(ApiError):
    def __init__(self) -> None:
        super().__init__(499, "client_disconnected", "the client closed the connection before its body was complete",
                         "body")


class BodyTimeout:
    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + self.timeout_s
        is_complete = False
        has_timed_out = False

        async def timed_receive() -> Message:
            nonlocal is_complete, has_timed_out
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
            if not message.get("more_body", False):
                is_complete = True
            return message

        async def closing_send(message: Message) -> None:
            if has_timed_out and message["type"] == "http.response.start":
                headers = [(name, value) for name, value in message.get("headers", []) if name != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, timed_receive, closing_send)
