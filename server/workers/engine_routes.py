"""Routes an API process hands whole to the engine: ``/v1/admin/faults`` and ``/v1/monitoring/*``.

Fault drills (``POST``/``DELETE /v1/admin/faults``) live in the engine,
which pushes every change to the API processes (``server.workers.engine_process``),
so a drill set through any API process's connection holds for all of them,
with the single process's answers and statuses. The latency monitor is the
engine's alone (every API process sends it its requests' records,
``server.workers.engine_monitor``), so its drift state, digests and baseline
are asked there.

Guards first, in the API process. ``ForwardToEngine`` is the innermost layer
of an API process's app, below every guard of ``server.http.middleware``, so a
forwarded route is guarded exactly as any other, before a byte of its body is
read: keys and roles (401/403, and the admin audit line), the rate limit (429,
from the table every API process shares, ``server.workers.shared_rate_buckets``),
the body's size and deadline (413, 408: ``BodyGuard`` wraps the ``receive``
this layer reads from), and one access-log line. The header deadline is
uvicorn's protocol, in the API process too. Only a request those let through
has its body read and sent on:

    client -> API process: AccessLog -> ApiKeyAuth -> RateLimit -> ... -> BodyGuard -> ForwardToEngine
           ("http", id, method, path, headers, body, client)  ->  engine: the app's routes, no guards
           <- ("ok", id, (status, headers, body))

The engine trusts the API process. It answers a forwarded request with the
app's routes and exception handlers but none of its middleware
(``EngineRoutes``): checking the key again would write each admin call's
audit line and access-log line twice, and taking a token from the engine's
own bucket would charge the caller twice, from a table that is not the
server's. Nothing else reaches these routes through the engine: its socket
lives in the supervisor's run directory (mode 0700, the server's user only),
and only API processes, after their guards, write ``http`` frames to it.

The body is read and sent only for a route whose endpoint declares one (a
FastAPI body parameter: ``POST /v1/admin/faults``); the others answer without
it, as the single process's routes do (``POST /v1/monitoring/baseline`` and the
``GET``s and ``DELETE`` answer a client that promised a body and sent none at
once). A forwarded route that reads its ``Request``'s body itself must declare
it instead, or it would get an empty one.

Inference routes are never forwarded: ``/v1/classify`` and ``/v1/rank`` are
parsed, tokenized and decoded in the API process like every other one, and
only their scoring is the engine's (``server.workers.zero_shot_client``).
"""

from __future__ import annotations

import json
import logging

from collections.abc import Awaitable, Callable, Sequence

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import ApiError

ENGINE_PATHS = frozenset({"/v1/admin/faults", "/v1/admin/faults/kill", "/v1/monitoring/drift", "/v1/monitoring/digests",
                          "/v1/monitoring/baseline"})
MONITOR_ENGINE = 0  # the engine holding the one latency monitor


def forwarded_targets(method: str, path: str, num_engines: int) -> list[int]:
    """The engines a forwarded request goes to: a drill change to every engine, or to the one ``?engine=N``
    names (so one engine can be slowed or killed), anything else to the monitor's engine. The first target
    answers."""
    route, _, query = path.partition("?")
    if not route.startswith("/v1/admin/faults"):
        return [MONITOR_ENGINE]
    for parameter in query.split("&"):
        name, _, value = parameter.partition("=")
        if name == "engine":
            if not value.isdigit() or int(value) >= num_engines:
                raise ApiError(422, "invalid_engine", f"engine must be an engine's number, 0 to {num_engines - 1}, "
                                                      f"got {value!r}", field="engine")
            return [int(value)]
    if route == "/v1/admin/faults/kill":
        raise ApiError(422, "invalid_engine", "killing an engine needs the engine's number: ?engine=N", field="engine")
    return list(range(num_engines))


FAULTS_PATH = "/v1/admin/faults"
ENGINE_BASE_URL = "http://mmserve-engine"  # the engine's in-process calls to its own routes


class _NotForwardedCalls(logging.Filter):
    """Drops httpx's ``HTTP Request: ...`` line for a call the engine makes to its own routes: the API process
    that forwarded it already logs the request (access log, audit); other httpx lines pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return ENGINE_BASE_URL not in record.getMessage()


_NOT_FORWARDED_CALLS = _NotForwardedCalls()  # one instance: addFilter skips a filter already added


def is_fault_list(path: str) -> bool:
    """Whether the answer to ``path`` lists the drills in force (``GET``/``POST``/``DELETE /v1/admin/faults``)."""
    return path.partition("?")[0] == FAULTS_PATH


def merged_fault_lists(answers: list[tuple[int, list[tuple[str, str]], bytes]]) -> tuple[int, list[tuple[str, str]],
                                                                                           bytes]:
    """One answer listing every engine's drills in force (each names its engine), from each engine's own answer
    to the same request or to ``GET /v1/admin/faults``; the first is the answer's, its status and headers kept.
    An error answer is passed on as it is."""
    status, headers, body = answers[0]
    if status != 200:
        return answers[0]
    active = [plan for _, _, each in answers for plan in json.loads(each)["active"]]
    merged = json.dumps({"active": sorted(active, key=lambda plan: plan["engine"])}, separators=(",", ":")).encode()
    headers = [(name, value) for name, value in headers if name.lower() != "content-length"]
    return status, [*headers, ("content-length", str(len(merged)))], merged


BODY_FRAMING_HEADERS = (b"content-length", b"transfer-encoding")  # the engine's client frames the body it sends

Forward = Callable[[str, str, list[tuple[str, str]], bytes, tuple[str, int]],
                   Awaitable[tuple[int, list[tuple[str, str]], bytes]]]


class ForwardToEngine:
    """Innermost ASGI layer of an API process: ``ENGINE_PATHS`` answered by the engine, after the guards.

    It must be added before the guards (Starlette runs the layer added last
    first), so that ``receive`` is ``BodyGuard``'s: a body that trickles past
    ``MMSERVE_BODY_TIMEOUT_S`` or grows past ``MMSERVE_MAX_BODY_BYTES`` is
    refused here (408, 413) and never reaches the engine.
    """

    def __init__(self, app: ASGIApp, forward: Forward, routes: Sequence[BaseRoute]) -> None:
        """``routes``: the app's route list, read at the first forwarded request (it is wired after this
        layer is added) for which of ``ENGINE_PATHS`` take a body."""
        self._app = app
        self._forward = forward
        self._routes = routes
        self._with_a_body: frozenset[tuple[str, str]] | None = None

    def takes_a_body(self, method: str, path: str) -> bool:
        if self._with_a_body is None:
            self._with_a_body = frozenset((method, route.path) for route in self._routes
                                          if isinstance(route, APIRoute) and route.path in ENGINE_PATHS
                                          and route.body_field is not None for method in route.methods)
        return (method, path) in self._with_a_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in ENGINE_PATHS:
            await self._app(scope, receive, send)
            return
        try:
            body = await _whole_body(receive) if self.takes_a_body(scope["method"], scope["path"]) else b""
            path = scope["path"] + (f"?{scope['query_string'].decode()}" if scope.get("query_string") else "")
            headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]
                       if name not in BODY_FRAMING_HEADERS]
            status, answer_headers, answer = await self._forward(scope["method"], path, headers, body,
                                                                 tuple(scope.get("client") or ("127.0.0.1", 0)))
        except ApiError as error:  # 408, 413 or 499 from BodyGuard's receive; 503 when the engine is gone
            await error.response()(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": status,
                    "headers": [(name.encode("latin-1"), value.encode("latin-1")) for name, value in answer_headers
                                if name.lower().encode("latin-1") not in BODY_FRAMING_HEADERS]
                    + [(b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})


async def _whole_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    more = True
    while more:
        message = await receive()  # BodyGuard's: raises on a deadline passed, a limit passed or a hang-up
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


class EngineRoutes:
    """The engine's side: a forwarded request through the app's routes and exception handlers, no middleware.

    The stack is FastAPI's own (``build_middleware_stack``: its server-error
    and exception layers around the router) built without the app's
    middleware, the guards the API process has already applied (the module's
    docstring says why the engine trusts it).
    """

    def __init__(self, app: FastAPI) -> None:
        # httpx logs each request at INFO: not a line per forwarded call (one filter per engine process).
        logging.getLogger("httpx").addFilter(_NOT_FORWARDED_CALLS)
        guards = app.user_middleware
        app.user_middleware = []
        try:
            stack = app.build_middleware_stack()
        finally:
            app.user_middleware = guards

        async def routes_only(scope: Scope, receive: Receive, send: Send) -> None:
            scope["app"] = app  # what Starlette's __call__ sets: the routes read request.app.state
            await stack(scope, receive, send)

        self._routes = routes_only

    async def answer(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
                     client: tuple[str, int]) -> tuple[int, list[tuple[str, str]], bytes]:
        import httpx  # the engine's side only: API processes import this module too, and httpx brings rich

        transport = httpx.ASGITransport(app=self._routes, client=client)
        async with httpx.AsyncClient(transport=transport, base_url=ENGINE_BASE_URL) as http:
            answer = await http.request(method, path, headers=headers, content=body)
        return answer.status_code, list(answer.headers.multi_items()), answer.content
