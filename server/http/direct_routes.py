"""The inference routes called straight from the guard layers, past FastAPI's per-request machinery.

Under ``wrk`` on the 2-core development machine, uvicorn answering a JSON
POST from a bare ASGI callable costs about 0.05 ms of CPU; the same
endpoint as a FastAPI route about 0.15 ms. The difference is the layers
every request crosses below the middleware: FastAPI's exception, exit-stack
and body-limit layers, the router's match, ``request_response`` and the
dependency solver; each a coroutine and a wrapped ``send``. The inference
routes use none of it: their endpoints take the ``Request`` alone and
answer every failure in their protocol's own error shape. So the innermost
guard layer calls them itself: ``POST /v1/embeddings`` then costs its own
work, the guards' (keys, limits, content types, body size and deadline,
access log) and uvicorn's.

What a client sees is the same: only a request the route would match fully
(its path and ``POST``) is taken here, so a wrong method still gets the
router's 405 and a trailing slash its redirect; an ``ApiError`` the endpoint
raises is answered as the app's exception handler answers it, and anything
else propagates to the server-error layer, as it would from the router.
The routes stay on the FastAPI app, so ``/openapi.json`` and ``/docs`` list
them as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import ApiError
from server.http.error_shapes import error_response

Endpoint = Callable[[Request], Awaitable[Response]]


def takes_only_the_request(route: APIRoute) -> bool:
    """An endpoint FastAPI would call with the ``Request`` and nothing else: no path, query, header, cookie or
    body parameters and no dependencies to solve."""
    dependant = route.dependant
    return (dependant.request_param_name is not None and not dependant.dependencies
            and not (dependant.path_params or dependant.query_params or dependant.header_params
                     or dependant.cookie_params or dependant.body_params)
            and dependant.websocket_param_name is None and dependant.response_param_name is None
            and dependant.background_tasks_param_name is None)


class DirectRouteTable:
    """The routes the direct layer calls itself, filled once the app's routes are wired."""

    def __init__(self) -> None:
        self.routes: tuple[APIRoute, ...] = ()

    def take(self, routes: Sequence[BaseRoute], paths: Sequence[tuple[str, str]]) -> None:
        """Of ``routes``, those that answer one of ``paths`` (method, path) and take only the request."""
        wanted = set(paths)
        chosen = []
        for route in routes:
            if not isinstance(route, APIRoute):
                continue
            if any((method, route.path) in wanted for method in route.methods) and takes_only_the_request(route):
                chosen.append(route)
        self.routes = tuple(chosen)


class DirectRoutes:
    """Innermost guard layer: calls a table route's endpoint for a request it fully matches."""

    def __init__(self, app: ASGIApp, table: DirectRouteTable) -> None:
        self.app = app
        self.table = table

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for route in self.table.routes:
                match, child_scope = route.matches(scope)
                if match is Match.FULL:
                    scope.update(child_scope)
                    await self._answer(route.endpoint, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    @staticmethod
    async def _answer(endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except ApiError as error:  # as the app's exception handler answers it
            response = error_response(error, scope.get("path", ""))
        await response(scope, receive, send)
