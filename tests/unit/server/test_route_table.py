"""The routes sit on the app's own router: matched once per request, with the schema include_router gives.

They are matched inference routes first (``server.http.route_order``), and
every request reaches the route it reached in declared order.
"""

from __future__ import annotations

import re

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Match

from server.app import create_app
from server.app_routes import _openapi
from server.http.route_order import INFERENCE_ROUTES, documented_routes
from server.routes import admin, health, infer, monitoring, openai, v2, zero_shot
from server.settings import Settings

MODULES = (infer, health, admin, v2, openai, zero_shot, monitoring)
METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS")
# Values for path parameters: plain, and with slashes (a ``:path`` parameter takes them).
PARAM_VALUES = ("m", "m/versions/1", "m/infer", "m/ready", "1", "infer")


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return create_app(Settings(preset="synthetic"))


def test_every_route_is_a_route_of_the_app_itself_in_declared_order(app):
    expected = [route for module in MODULES for route in module.router.routes]
    declared = [route for route in documented_routes(app) if isinstance(route, APIRoute)]
    assert declared == expected  # no router entry to search first: each request is matched once
    assert sorted(map(id, app.routes)) == sorted(map(id, documented_routes(app)))  # the same routes


def test_the_inference_routes_are_tried_first_most_used_first(app):
    tried = [(next(iter(route.methods)), route.path) for route in app.routes[: len(INFERENCE_ROUTES)]]
    assert tried == list(INFERENCE_ROUTES)
    assert tried[0] == ("POST", "/v1/embeddings")


def test_the_openapi_schema_is_the_one_the_included_routers_give_in_declared_order(app):
    included = FastAPI(title=app.title, version=app.version, description=app.description)
    for module in MODULES:
        included.include_router(module.router)
    assert _openapi(app) == _openapi(included)
    assert list(_openapi(app)["paths"]) == list(_openapi(included)["paths"])


def dispatched(routes: list[BaseRoute], method: str, path: str) -> BaseRoute | None:
    """The route Starlette's router hands ``method path`` to: the first full match, else the first partial."""
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    partial = None
    for route in routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return route
        if match == Match.PARTIAL and partial is None:
            partial = route
    return partial


def sample_paths(routes: list[BaseRoute]) -> set[str]:
    """Every route's path with each parameter filled by each sample value, and the paths as declared."""
    paths = set()
    for route in routes:
        template = getattr(route, "path", None)
        if template is None:
            continue
        paths.add(template)
        for value in PARAM_VALUES:
            paths.add(re.sub(r"\{[^}]+\}", value, template))
    return paths | {"/v1/embeddings/", "/v2/models/m/versions/1/infer/", "/nowhere"}


def test_every_request_reaches_the_route_it_reached_in_declared_order(app):
    declared, matched = list(documented_routes(app)), list(app.routes)
    assert matched != declared  # the order did change
    paths = sample_paths(declared)
    assert len(paths) > 50
    for path in sorted(paths):
        for method in METHODS:
            assert dispatched(matched, method, path) is dispatched(declared, method, path), (method, path)
