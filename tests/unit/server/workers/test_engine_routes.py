"""Forwarding to the engine happens below the API process's guards, and the engine applies none of its own.

The live walk over every route with ``--api-workers 2`` is
``tests/integration/test_api_workers_guards.py``; these check the two halves
in process: an API process's app (``create_api_app``, before its engine is
reached: a forwarded request would fail, so a refusal shows nothing was
forwarded) and ``EngineRoutes`` over a guarded app.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from server.http.middleware import add_request_guards
from server.settings import Settings
from server.workers.api_process import create_api_app
from server.workers.engine_routes import ENGINE_PATHS, EngineRoutes

KEY, ADMIN_KEY = "inference-key-Uy6t", "admin-key-Po3i"
BODY_TIMEOUT_S = 0.2


def guarded_settings(**overrides: object) -> Settings:
    return Settings(preset="tiny", device="cpu", api_keys=KEY, admin_api_keys=ADMIN_KEY, enable_fault_injection=True,
                    body_timeout_s=BODY_TIMEOUT_S, rate_limit="1/s,burst=1", **overrides)


async def ask(app: FastAPI, method: str, path: str, key: str | None = None,
              content: bytes | AsyncIterator[bytes] = b"", headers: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.request(method, path, content=content, headers=headers)


@pytest.fixture
def api_app(tmp_path) -> FastAPI:
    return create_api_app(guarded_settings(api_workers=2), [str(tmp_path / "engine-0.sock")], str(tmp_path))


@pytest.mark.parametrize("method, path", [("POST", "/v1/admin/faults"), ("DELETE", "/v1/admin/faults"),
                                          ("GET", "/v1/monitoring/drift"), ("POST", "/v1/monitoring/baseline")])
def test_an_api_process_refuses_a_keyless_forwarded_request_itself(api_app: FastAPI, method: str, path: str):
    assert path in ENGINE_PATHS
    answer = asyncio.run(ask(api_app, method, path, content=b"{}"))
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "missing_api_key"


def test_an_api_process_refuses_an_inference_key_on_a_forwarded_admin_route(api_app: FastAPI):
    answer = asyncio.run(ask(api_app, "POST", "/v1/admin/faults", KEY, b"{}"))
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden"


def test_an_api_process_times_a_forwarded_body_out_itself(api_app: FastAPI):
    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"stage": '
        await asyncio.sleep(BODY_TIMEOUT_S * 5)
        yield b'"text"}'

    answer = asyncio.run(ask(api_app, "POST", "/v1/admin/faults", ADMIN_KEY, trickle()))
    assert answer.status_code == 408 and answer.json()["error"]["code"] == "body_timeout"


def test_an_api_process_refuses_a_forwarded_body_over_the_limit_itself(tmp_path):
    app = create_api_app(guarded_settings(api_workers=2, max_body_bytes=1_000), [str(tmp_path / "engine-0.sock")],
                         str(tmp_path))
    answer = asyncio.run(ask(app, "POST", "/v1/admin/faults", ADMIN_KEY, b"x" * 2_000))
    assert answer.status_code == 413


def test_an_api_process_rate_limits_a_forwarded_route_from_its_own_table(api_app: FastAPI):
    """The burst of 1, taken by a request the API process refuses after the limiter (415), leaves nothing for a
    forwarded route."""
    async def scenario() -> tuple[int, httpx.Response]:
        first = await ask(api_app, "GET", "/openapi.json", KEY)  # docs: never limited
        taken = await ask(api_app, "POST", "/v1/embeddings", KEY, b"", {"Content-Type": "text/plain"})
        return first.status_code, taken, await ask(api_app, "GET", "/v1/monitoring/drift", KEY)

    docs_status, taken, forwarded = asyncio.run(scenario())
    assert docs_status == 200 and taken.status_code == 415
    assert forwarded.status_code == 429 and forwarded.json()["error"]["code"] == "rate_limited"
    assert int(forwarded.headers["Retry-After"]) >= 1


class Drill(BaseModel):
    stage: str


def guarded_app() -> FastAPI:
    """The guards of every process over two routes shaped like the engine's forwarded ones."""
    app = FastAPI()
    add_request_guards(app, guarded_settings())

    @app.get("/v1/monitoring/drift")
    async def drift() -> dict:
        return {"routes": {}}

    @app.post("/v1/admin/faults")
    async def add_fault(body: Drill) -> dict:
        return {"active": [body.stage]}

    return app


def test_the_engine_answers_with_the_routes_and_no_guards():
    """No key check (the API process made it) and no token taken (the API process took it from the server's
    table): three calls past a burst of 1, keyless, all answered."""
    app = guarded_app()
    routes = EngineRoutes(app)

    async def scenario() -> tuple[list, tuple, tuple, httpx.Response]:
        answers = [await routes.answer("GET", "/v1/monitoring/drift", [], b"", ("10.0.0.7", 1234)) for _ in range(3)]
        added = await routes.answer("POST", "/v1/admin/faults", [("content-type", "application/json")],
                                    b'{"stage": "text"}', ("10.0.0.7", 1234))
        invalid = await routes.answer("POST", "/v1/admin/faults", [("content-type", "application/json")],
                                      b'{"stage": 3', ("10.0.0.7", 1234))
        return answers, added, invalid, await ask(app, "GET", "/v1/monitoring/drift")

    answers, added, invalid, guarded = asyncio.run(scenario())
    assert [status for status, _, _ in answers] == [200, 200, 200]
    assert answers[0][2] == b'{"routes":{}}'
    assert added[0] == 200 and added[2] == b'{"active":["text"]}'
    assert invalid[0] == 422  # the app's exception handlers still answer
    assert guarded.status_code == 401  # the same app, called with its guards, refuses


def test_the_engine_logs_no_httpx_line_per_forwarded_call(caplog):
    """The API process logs the forwarded request (access log, audit); the engine adds no ``HTTP Request:``
    line of its own for each (httpx logs every request at INFO)."""
    routes = EngineRoutes(guarded_app())
    with caplog.at_level("INFO", logger="httpx"):
        status, _, _ = asyncio.run(routes.answer("GET", "/v1/monitoring/drift", [], b"", ("10.0.0.7", 1234)))
    assert status == 200
    assert [record.getMessage() for record in caplog.records if record.name == "httpx"] == []
