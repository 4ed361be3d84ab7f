"""The inference routes answered by the innermost guard layer, past FastAPI's router, as the router answers them.

A small FastAPI app with the layer in front: a route that takes only the
request is answered there (Starlette's router never sees the request, so
never marks its scope); everything else, and a request the route does not
fully match, goes to the router as before.
"""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.testclient import TestClient

from server.app import create_app
from server.errors import ApiError
from server.http.direct_routes import DirectRoutes, DirectRouteTable
from server.settings import Settings


def _app() -> FastAPI:
    app = FastAPI()
    app.add_exception_handler(ApiError, lambda request, error: error.response())
    table = DirectRouteTable()
    app.add_middleware(DirectRoutes, table=table)

    @app.post("/v1/answer")
    async def answer(request: Request) -> JSONResponse:
        if (await request.body()) == b"refuse":
            raise ApiError(422, "refused", "the body says refuse", "body")
        if (await request.body()) == b"crash":
            raise RuntimeError("a bug")
        return JSONResponse({"via_router": "router" in request.scope})

    @app.post("/v1/models/{name}")
    async def named(request: Request, name: str) -> JSONResponse:
        return JSONResponse({"via_router": "router" in request.scope, "name": name})

    @app.post("/v1/refuse")
    async def refuse(request: Request) -> JSONResponse:  # not in the table: the router's way, for comparison
        raise ApiError(422, "refused", "the body says refuse", "body")

    table.take(app.routes, [("POST", "/v1/answer"), ("POST", "/v1/models/{name}")])
    return app


@pytest.fixture
def client() -> TestClient:
    return TestClient(_app(), raise_server_exceptions=False, follow_redirects=False)


def test_a_route_that_takes_only_the_request_is_answered_without_the_router(client):
    response = client.post("/v1/answer", content=b"{}")
    assert response.status_code == 200 and response.json() == {"via_router": False}


def test_a_route_with_a_path_parameter_stays_with_the_router(client):
    response = client.post("/v1/models/m", content=b"{}")
    assert response.json() == {"via_router": True, "name": "m"}


def test_a_wrong_method_or_a_trailing_slash_gets_the_routers_answer(client):
    assert (client.get("/v1/answer")).status_code == 405
    redirect = client.post("/v1/answer/", content=b"{}")
    assert redirect.status_code == 307 and redirect.headers["location"].endswith("/v1/answer")


def test_an_api_error_is_answered_as_the_apps_handler_answers_it(client):
    direct = client.post("/v1/answer", content=b"refuse")
    routed = client.post("/v1/refuse", content=b"refuse")
    assert direct.status_code == routed.status_code == 422
    assert direct.json() == routed.json() == {"error": {"code": "refused", "message": "the body says refuse",
                                                        "field": "body"}}


def test_any_other_exception_is_a_500_from_the_server_error_layer(client):
    response = client.post("/v1/answer", content=b"crash")
    assert response.status_code == 500


def test_the_server_answers_its_exact_path_inference_routes_directly():
    app = create_app(Settings(preset="synthetic"))
    layer = next(m for m in app.user_middleware if m.cls is DirectRoutes)
    assert app.user_middleware[-1] is layer  # the innermost: every guard runs before it
    table = layer.kwargs["table"]
    assert [(next(iter(r.methods)), r.path) for r in table.routes] == [
        ("POST", "/v1/embeddings"), ("POST", "/v1/infer"), ("POST", "/v1/classify"), ("POST", "/v1/rank")]
