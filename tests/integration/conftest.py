"""Fixtures the integration tests share beyond ``tests/conftest.py``: reading a raw socket to its end, and
each HTTP parser uvicorn may use."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest

import server.http.header_timeout


def _read_until_closed(sock: socket.socket, timeout_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when (``time.monotonic``) it closed.

    Fails the test when the connection is still open ``timeout_s`` after the call began.
    """
    deadline = time.monotonic() + timeout_s
    received = b""
    while True:
        remaining_s = deadline - time.monotonic()
        try:
            if remaining_s <= 0:
                raise TimeoutError
            sock.settimeout(remaining_s)
            chunk = sock.recv(65536)
        except TimeoutError as e:
            raise AssertionError(f"the connection stayed open {timeout_s} s, after {received[:200]!r}") from e
        if not chunk:
            return received, time.monotonic()
        received += chunk


@pytest.fixture
def read_until_closed() -> Callable[[socket.socket, float], tuple[bytes, float]]:
    """``answer, closed_at = read_until_closed(sock, timeout_s)``; fails if the server keeps it open."""
    return _read_until_closed


@pytest.fixture(params=["httptools", "h11"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each HTTP parser uvicorn may use: httptools when installed (it is: uvicorn[standard]), h11 otherwise."""
    if request.param == "h11":
        monkeypatch.setattr(server.http.header_timeout, "_httptools_protocol", lambda: None)
    return request.param
