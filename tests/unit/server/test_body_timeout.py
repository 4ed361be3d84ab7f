"""The body deadline: bounded in the request's own task, 408 with ``Connection: close`` once it passes."""

from __future__ import annotations

import asyncio

from server.errors import ApiError
from server.http.body_timeout import BodyTimeout

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

        await BodyTimeout(app, timeout_s=5.0)(SCOPE, receive, send)
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
        await BodyTimeout(app, timeout_s=0.05)(SCOPE, receive, send)
        return sent, asyncio.get_running_loop().time() - started

    sent, elapsed_s = asyncio.run(scenario())
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
    assert b'"code":"body_timeout"' in sent[1]["body"]
    assert elapsed_s < 5
