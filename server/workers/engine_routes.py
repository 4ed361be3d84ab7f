"""Routes an API process hands whole to the engine: ``/v1/admin/faults`` and ``/v1/monitoring/*``.

Fault drills (``POST``/``DELETE /v1/admin/faults``) live in the engine,
which pushes every change to the API processes (``server.workers.engine_process``),
so a drill set through any API process's connection holds for all of them,
with the single process's answers, statuses and admin keys. The latency
monitor is the engine's alone (every API process sends it its requests'
records, ``server.workers.engine_monitor``), so its drift state, digests and
baseline are asked there. The API process reads the body (up to
``max_body_bytes``; a larger one goes to its own app, which answers 413 as
always) and the engine answers it with the single process's app (same keys,
limits, answers and errors), through the app's ASGI interface.

Inference routes are never forwarded: ``/v1/classify`` and ``/v1/rank`` are
parsed, tokenized and decoded in the API process like every other one, and
only their scoring is the engine's (``server.workers.zero_shot_client``).

    API process                                   engine
    ("http", id, method, path, headers, body, client)  ->  the app, in process (httpx.ASGITransport)
    <- ("ok", id, (status, headers, body))
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
from fastapi import FastAPI
from server.errors import ApiError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ENGINE_PATHS = frozenset({"/v1/admin/faults", "/v1/monitoring/drift", "/v1/monitoring/digests",
                          "/v1/monitoring/baseline"})


class ForwardToEngine:
    """ASGI middleware of the API process: ``ENGINE_PATHS`` answered by the engine."""

    def __init__(self, app: ASGIApp, forward: Callable[..., Awaitable[tuple[int, list, bytes]]],
                 max_body_bytes: int) -> None:
        self._app = app
        self._forward = forward
        self._max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in ENGINE_PATHS:
            await self._app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            more = message.get("more_body", False)
            if size > self._max_body_bytes:  # the app's own limit answers it
                await self._app(scope, _replay(chunks, more, receive), send)
                return
        path = scope["path"] + (f"?{scope['query_string'].decode()}" if scope.get("query_string") else "")
        headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]]
        try:
            status, answer_headers, body = await self._forward(scope["method"], path, headers, b"".join(chunks),
                                                               tuple(scope.get("client") or ("127.0.0.1", 0)))
        except ApiError as error:  # the engine is gone (503)
            await error.response()(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": status,
                    "headers": [(name.encode("latin-1"), value.encode("latin-1")) for name, value in answer_headers
                                if name.lower() not in ("content-length", "transfer-encoding")]
                    + [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _replay(chunks: list[bytes], more: bool, receive: Receive) -> Receive:
    pending = list(chunks)

    async def replayed() -> Message:
        if pending:
            return {"type": "http.request", "body": pending.pop(0), "more_body": bool(pending) or more}
        return await receive()

    return replayed


async def answer_in_engine(app: FastAPI, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
                           client: tuple[str, int]) -> tuple[int, list[tuple[str, str]], bytes]:
    """The engine's side: the request through the single process's app."""
    transport = httpx.ASGITransport(app=app, client=client)
    async with httpx.AsyncClient(transport=transport, base_url="http://mmserve-engine") as http:
        answer = await http.request(method, path, headers=headers, content=body)
    return answer.status_code, list(answer.headers.multi_items()), answer.content
