"""The body guard: the deadline bounded in the request's own task (408 with ``Connection: close`` once it passes),
and the size limit, declared (413 before a byte is read) or streamed."""

from __future__ import annotations

import asyncio

from server.errors import ApiError
from server.http.body_guard import BodyGuard

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
