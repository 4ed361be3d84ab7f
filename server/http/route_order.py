"""The order requests are matched against the routes in: the inference routes first.

Starlette matches a request by trying the app's routes in order until one
matches, a regular expression and a method check each. The inference
routes came after FastAPI's own docs routes, health, admin and the KServe
metadata routes: ``POST /v1/embeddings`` was tried against 22 routes before
its own. Here they come first, most used first, and every other route keeps
its order behind them:

    /v1/embeddings, /v1/infer, /v2/models/{m}/versions/{v}/infer, /v2/models/{m}/infer,
    /v1/classify, /v1/rank, then the rest as declared

Moving a route forward changes nothing a client sees as long as no request
the moved route matches (its path, whatever the method) is also matched by a
route it passes; the tests check every route's path under every method. The
two v2 infer routes keep their relative order (``{m:path}`` would take
``m/versions/v``). ``/openapi.json`` and ``/docs`` list the routes in
declared order (``documented_routes``).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI
from starlette.routing import BaseRoute

INFERENCE_ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/infer"),
    ("POST", "/v2/models/{model_name:path}/versions/{model_version}/infer"),
    ("POST", "/v2/models/{model_name:path}/infer"),
    ("POST", "/v1/classify"),
    ("POST", "/v1/rank"),
)
_RANK = {key: rank for rank, key in enumerate(INFERENCE_ROUTES)}
_DOCUMENTED = "documented_routes"


def _rank(route: BaseRoute) -> int:
    path, methods = getattr(route, "path", None), getattr(route, "methods", None) or ()
    return min((_RANK.get((method, path), len(_RANK)) for method in methods), default=len(_RANK))


def match_inference_routes_first(app: FastAPI) -> None:
    """Reorder the app's routes for matching (a stable sort: the rest keep their order); call once, last."""
    setattr(app.state, _DOCUMENTED, list(app.router.routes))
    app.router.routes.sort(key=_rank)


def documented_routes(app: FastAPI) -> Sequence[BaseRoute]:
    """The routes in declared order, for the schema (the matching order where none was kept)."""
    return getattr(app.state, _DOCUMENTED, app.router.routes)

