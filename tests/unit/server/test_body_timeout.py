"""The body guard: the deadline bounded in the request's own task (408 with ``Connection: close`` once it passes),
and the size limit, declared (413 before a byte is read) or streamed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI
from pydantic import BaseModel

from server.errors import ApiError
from server.http.body_guard import BodyGuard
from server.http.middleware import add_request_guards
from server.settings import Settings

SCOPE = {"type": "http", "method": "POST", "path": "/v1/infer", "headers": []}


def test_the_body_is_read_in_the_requests_own_task():
    """No task per ``receive``: the handler's task reads it, and the whole body comes through."""
    readers: list[asyncio.Task | None] = []
    chunks = [{"type": "http.request", "body": b'{"te', "more_body": True},
              {"type": "http.request", "body": b'xt": "a"}', "more_body": False}]

    async def receive() -> dict:
        readers.append(asyncio.current_task())
        return chunks.pop(0)

    async def app(scope, receive, send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message["body"]
            if not message["more_body"]:
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    async def scenario() -> tuple[list, asyncio.Task | None]:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        await BodyGuard(app, timeout_s=5.0, max_body_bytes=1_000)(SCOPE, receive, send)
        return sent, asyncio.current_task()

    sent, task = asyncio.run(scenario())
    assert readers == [task, task]
    assert sent[0]["headers"] == [] and sent[1]["body"] == b'{"text": "a"}'


def test_a_body_that_does_not_arrive_in_time_gets_408_and_a_closed_connection():
    async def receive() -> dict:
        await asyncio.sleep(30)  # a client that sent its headers and nothing more
        return {"type": "http.request", "body": b"", "more_body": False}

    async def app(scope, receive, send) -> None:
        try:
            await receive()
        except ApiError as e:
            await e.response()(scope, receive, send)

    async def scenario() -> tuple[list, float]:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        started = asyncio.get_running_loop().time()
        await BodyGuard(app, timeout_s=0.05)(SCOPE, receive, send)
        return sent, asyncio.get_running_loop().time() - started

    sent, elapsed_s = asyncio.run(scenario())
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
    assert b'"code":"body_timeout"' in sent[1]["body"]
    assert elapsed_s < 5


def _run(guard_app, scope: dict, chunks: list[bytes]) -> tuple[list[dict], int]:
    """What the guard sends for a body streamed in ``chunks``, and how many chunks were read."""
    messages = [{"type": "http.request", "body": chunk, "more_body": index < len(chunks) - 1}
                for index, chunk in enumerate(chunks)]
    num_read = 0

    async def receive() -> dict:
        nonlocal num_read
        num_read += 1
        return messages.pop(0)

    async def scenario() -> list[dict]:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        await guard_app(scope, receive, send)
        return sent

    return asyncio.run(scenario()), num_read


async def _echo_or_refuse(scope, receive, send) -> None:
    """Reads the whole body, then answers 200 with it; an ``ApiError`` from ``receive`` is answered as such."""
    body = b""
    try:
        while True:
            message = await receive()
            body += message["body"]
            if not message["more_body"]:
                break
    except ApiError as e:
        await e.response()(scope, receive, send)
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def test_a_declared_length_over_the_limit_gets_413_before_a_byte_is_read_and_is_counted():
    rejected: list[str] = []
    scope = {**SCOPE, "headers": [(b"content-type", b"application/json"), (b"content-length", b"11")]}
    guard = BodyGuard(_echo_or_refuse, timeout_s=5.0, max_body_bytes=10, on_reject=rejected.append)
    sent, num_read = _run(guard, scope, [b"x" * 11])
    assert num_read == 0 and rejected == ["/v1/infer"]
    assert sent[0]["status"] == 413 and b'"code":"body_too_large"' in sent[1]["body"].replace(b" ", b"")
    assert b"10" in sent[1]["body"]  # the limit is named


def test_a_streamed_body_over_the_limit_is_cut_off_when_it_passes_it():
    guard = BodyGuard(_echo_or_refuse, timeout_s=5.0, max_body_bytes=10)
    sent, num_read = _run(guard, SCOPE, [b"x" * 6, b"x" * 6, b"x" * 6])
    assert num_read == 2  # the third chunk is never read
    assert sent[0]["status"] == 413 and (b"connection", b"close") in sent[0]["headers"]  # the rest is never read


def test_a_body_at_the_limit_passes_whole():
    guard = BodyGuard(_echo_or_refuse, timeout_s=5.0, max_body_bytes=10)
    scope = {**SCOPE, "headers": [(b"content-length", b"10")]}
    sent, num_read = _run(guard, scope, [b"x" * 4, b"x" * 6])
    assert num_read == 2 and sent[0]["status"] == 200 and sent[1]["body"] == b"x" * 10


class Drill(BaseModel):  # at module level: FastAPI resolves the endpoint's annotation by name
    stage: str


def test_a_route_with_a_declared_body_answers_the_guards_refusal_not_fastapis_400():
    """FastAPI reads a declared body itself and turns whatever ``receive`` raises into 400 "error parsing the
    body"; the app answers the guard's 408 or 413 instead (``POST /v1/admin/faults`` is such a route)."""
    app = FastAPI()
    add_request_guards(app, Settings(preset="tiny", device="cpu", body_timeout_s=0.2, max_body_bytes=1_000))

    @app.post("/v1/admin/faults")
    async def add_fault(body: Drill) -> dict:
        return {"active": [body.stage]}

    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"stage": '
        await asyncio.sleep(1.0)
        yield b'"text"}'

    async def too_long() -> AsyncIterator[bytes]:  # chunked: no Content-Length to refuse it up front
        for _ in range(3):
            yield b"x" * 600

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [await client.post("/v1/admin/faults", content=content, headers={"Content-Type": "application/json"})
                    for content in (trickle(), too_long(), b'{"stage": "text"}', b'{"stage": ')]

    slow, large, whole, malformed = asyncio.run(scenario())
    assert slow.status_code == 408 and slow.json()["error"]["code"] == "body_timeout"
    assert slow.headers["connection"] == "close"
    assert large.status_code == 413
    assert whole.status_code == 200 and whole.json() == {"active": ["text"]}
    assert malformed.status_code == 422  # FastAPI's own answers are unchanged
