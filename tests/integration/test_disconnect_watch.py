"""The HTTP protocol tells a request its client went away (``server.http.disconnect_watch``), under both parsers.

A small ASGI app served by real uvicorn with the protocol class ``mmserve
serve`` uses; raw sockets as clients. A request that is still unanswered
when its client closes the connection has its watch fired; one already
answered does not, and neither ever needs a task awaiting ``receive()``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

import server.http.header_timeout
from server.http.disconnect_watch import SCOPE_KEY, DisconnectWatch
from server.http.header_timeout import header_timeout_protocol


class WatchingApp:
    """``/wait`` answers after 30 s unless its client goes away; ``/quick`` answers at once. Records each watch."""

    def __init__(self) -> None:
        self.watches: dict[str, DisconnectWatch | None] = {}
        self.fired: dict[str, threading.Event] = {"wait": threading.Event(), "quick": threading.Event()}
        self.cancelled = threading.Event()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        name = scope["path"].strip("/")
        while (await receive()).get("more_body"):
            pass
        watch = scope.get(SCOPE_KEY)
        self.watches[name] = watch
        if watch is not None:
            watch.add(self.fired[name].set)
        if name == "wait":
            task = asyncio.current_task()
            if watch is not None:
                watch.add(task.cancel)
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.set()
                return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(params=["httptools", "h11"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "h11":
        monkeypatch.setattr(server.http.header_timeout, "_httptools_protocol", lambda: None)
    return request.param


@pytest.fixture
def served(parser) -> Iterator[tuple[WatchingApp, int]]:
    app = WatchingApp()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=header_timeout_protocol(10.0), log_level="warning", access_log=False,
                            lifespan="off")
    uvicorn_server = uvicorn.Server(config)
    thread = threading.Thread(target=uvicorn_server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uvicorn_server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield app, sock.getsockname()[1]
    finally:
        uvicorn_server.should_exit = True
        thread.join(10)


def _post(port: int, path: str) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port))
    client.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}" % path.encode())
    return client


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_client_that_goes_away_fires_its_requests_watch(served):
    app, port = served
    client = _post(port, "/wait")
    _wait_for(lambda: "wait" in app.watches)
    assert isinstance(app.watches["wait"], DisconnectWatch)
    assert not app.fired["wait"].is_set()
    client.close()
    assert app.fired["wait"].wait(5), "the watch did not fire"
    assert app.cancelled.wait(5)  # the callback the request registered cancelled it
    assert app.watches["wait"].is_disconnected


def test_an_answered_request_is_not_told_of_the_connection_closing_later(served):
    app, port = served
    client = _post(port, "/quick")
    client.settimeout(5)
    assert client.recv(1024).startswith(b"HTTP/1.1 200")
    watch = app.watches["quick"]
    assert isinstance(watch, DisconnectWatch)
    client.close()
    time.sleep(0.2)
    assert not app.fired["quick"].is_set() and not watch.is_disconnected
