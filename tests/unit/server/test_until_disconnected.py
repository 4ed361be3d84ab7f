"""``until_disconnected``: a client's disconnect cancels the work, told by the protocol's watch or, without one,
by a watcher task reading ``receive()``; a disconnect after the work ended cancels nothing."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from server.http.disconnect_watch import SCOPE_KEY, DisconnectWatch
from server.http.client_disconnect import ClientDisconnectedError, until_disconnected

SCOPE = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": []}


def _request(watch: DisconnectWatch | None, disconnected: asyncio.Event) -> Request:
    async def receive() -> dict:
        await disconnected.wait()
        return {"type": "http.disconnect"}

    scope = dict(SCOPE) if watch is None else {**SCOPE, SCOPE_KEY: watch}
    return Request(scope, receive)


@pytest.mark.parametrize("has_watch", [True, False])
def test_a_disconnect_while_waiting_cancels_the_work(has_watch):
    async def scenario() -> bool:
        disconnected = asyncio.Event()
        watch = DisconnectWatch() if has_watch else None
        work_cancelled = asyncio.Event()

        async def work() -> str:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                work_cancelled.set()
                raise
            return "answer"

        async def client_leaves() -> None:
            await asyncio.sleep(0.01)
            disconnected.set()
            if watch is not None:
                watch.fire()

        leaving = asyncio.ensure_future(client_leaves())
        with pytest.raises(ClientDisconnectedError):
            await until_disconnected(_request(watch, disconnected), work())
        await leaving
        return work_cancelled.is_set() and asyncio.current_task().cancelling() == 0

    assert asyncio.run(scenario())


@pytest.mark.parametrize("has_watch", [True, False])
def test_a_disconnect_after_the_work_ended_cancels_nothing(has_watch):
    async def scenario() -> str:
        disconnected = asyncio.Event()
        watch = DisconnectWatch() if has_watch else None

        async def work() -> str:
            return "answer"

        answer = await until_disconnected(_request(watch, disconnected), work())
        disconnected.set()  # the client leaves once it has its answer
        if watch is not None:
            watch.fire()
        await asyncio.sleep(0.05)  # the request's task goes on (render, send): nothing cancels it
        return answer

    assert asyncio.run(scenario()) == "answer"
