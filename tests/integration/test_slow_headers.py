"""Clients that trickle their request headers, on raw sockets: they get 408 and lose the connection.

Each test runs under both HTTP parsers uvicorn may use (``parser``, tests/integration/conftest.py).
"""

from __future__ import annotations

import json
import socket
import threading
import time

REQUEST_BODY = b'{"text": "a prompt client"}'
REQUEST_HEAD = (b"POST /v1/infer HTTP/1.1\r\nHost: mmserve\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(REQUEST_BODY))


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)))


def _read_one_answer(sock: socket.socket) -> bytes:
    """One complete answer (head and Content-Length body) from a keep-alive connection."""
    sock.settimeout(10)
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_trickled_headers_get_408_and_a_silent_connection_is_closed(live_server_factory, parser,
                                                                   read_until_closed):
    with live_server_factory(header_timeout_s=1.0) as live:
        trickler, silent = _connect(live.url), _connect(live.url)
        started = time.monotonic()
        trickler.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: x\r\n")
        stop = threading.Event()

        def trickle() -> None:
            try:
                while not stop.wait(0.2):
                    trickler.sendall(b"x")  # one byte of an endless header name
            except OSError:
                pass  # the server closed the connection: the point of the test

        thread = threading.Thread(target=trickle, daemon=True)
        thread.start()
        try:
            answer, trickler_closed_at = read_until_closed(trickler, timeout_s=5)
            silence, silent_closed_at = read_until_closed(silent, timeout_s=5)
        finally:
            stop.set()
            thread.join(timeout=5)
            trickler.close()
            silent.close()

        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        head, _, body = answer.partition(b"\r\n\r\n")
        assert b"connection: close" in head.lower()
        assert json.loads(body)["error"]["code"] == "header_timeout"
        assert 0.9 < trickler_closed_at - started < 2.0
        assert silence == b""  # it asked nothing, so it is told nothing
        assert 0.9 < silent_closed_at - started < 2.0
        with _connect(live.url) as sock:  # a fresh connection is served as usual
            sock.sendall(REQUEST_HEAD + REQUEST_BODY)
            assert _read_one_answer(sock).startswith(b"HTTP/1.1 200")


def test_keep_alive_idle_time_does_not_count_against_the_next_requests_headers(live_server_factory, parser,
                                                                              read_until_closed):
    with live_server_factory(header_timeout_s=0.6, keep_alive_timeout_s=1.2) as live, _connect(live.url) as sock:
        sock.sendall(REQUEST_HEAD + REQUEST_BODY)
        assert _read_one_answer(sock).startswith(b"HTTP/1.1 200")
        time.sleep(0.8)  # idle longer than the header limit, shorter than keep-alive
        # The next request's headers arrive in pieces, within the limit of their first byte.
        for piece in (REQUEST_HEAD[:10], REQUEST_HEAD[10:40], REQUEST_HEAD[40:]):
            sock.sendall(piece)
            time.sleep(0.1)
        sock.sendall(REQUEST_BODY)
        assert _read_one_answer(sock).startswith(b"HTTP/1.1 200")
        answered_at = time.monotonic()
        rest, closed_at = read_until_closed(sock, timeout_s=10)
        assert rest == b""  # closed as an idle keep-alive connection: no 408
        assert 1.1 < closed_at - answered_at < 2.5
