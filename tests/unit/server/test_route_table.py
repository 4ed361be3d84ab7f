"""The routes sit on the app's own router: matched once per request, with the schema include_router gives."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRoute

from server.app import _openapi, create_app
from server.routes import admin, health, infer, monitoring, openai, v2, zero_shot
from server.settings import Settings

MODULES = (infer, health, admin, v2, openai, zero_shot, monitoring)


def test_every_route_is_a_route_of_the_app_itself_in_order():
    app = create_app(Settings(preset="synthetic"))
    expected = [route for module in MODULES for route in module.router.routes]
    api_routes = [route for route in app.routes if isinstance(route, APIRoute)]
    assert api_routes == expected  # no router entry to search first: each request is matched once


def test_the_openapi_schema_is_the_one_the_included_routers_give():
    app = create_app(Settings(preset="synthetic"))
    included = FastAPI(title=app.title, version=app.version, description=app.description)
    for module in MODULES:
        included.include_router(module.router)
    assert _openapi(app) == _openapi(included)
