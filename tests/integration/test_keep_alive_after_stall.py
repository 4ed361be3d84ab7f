"""A request that arrives on a keep-alive connection while the event loop is stalled is answered.

uvloop (uvicorn's loop where installed) runs due timers before it polls the
sockets. When the loop stalls (a long GIL hold, a process descheduled on a busy
machine) past a connection's keep-alive deadline while the client's next
request already waits in the socket, the keep-alive timer used to close the
connection before the request was read: closing with unread bytes resets it,
and the client, having sent a request on an open connection, saw the reset
instead of an answer (the ``--api-workers 2`` soak's transport errors).
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

KEEP_ALIVE_S = 0.5
STALL_S = 1.5
PROBE = b"GET /health/live HTTP/1.1\r\nHost: mmserve\r\n\r\n"


def _answer_head(sock: socket.socket) -> bytes:
    """The status line and headers of one answer, b"" if the server closed the connection instead."""
    sock.settimeout(10)
    received = b""
    try:
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            if not chunk:
                return b""
            received += chunk
    except ConnectionResetError:
        return b""
    return received.partition(b"\r\n\r\n")[0]


def _stall(loop: asyncio.AbstractEventLoop, stall_rx: socket.socket) -> None:
    """A reader callback that holds the loop for STALL_S: a stall in the loop's socket phase, as a GIL
    convoy or a descheduled process makes one, after which uvloop runs its due timers first."""
    loop.remove_reader(stall_rx.fileno())
    stall_rx.recv(1)
    time.sleep(STALL_S)


@pytest.mark.usefixtures("parser")
def test_a_request_waiting_in_the_socket_when_keep_alive_runs_out_is_answered(live_server_factory):
    with live_server_factory(keep_alive_timeout_s=KEEP_ALIVE_S) as live:
        loop = live.server.servers[0].get_loop()
        host, port = live.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as connection:
            connection.sendall(PROBE)
            assert _answer_head(connection).startswith(b"HTTP/1.1 200")  # the keep-alive clock starts now
            stall_rx, stall_tx = socket.socketpair()
            with stall_rx, stall_tx:
                # The server's loop stalls inside a socket callback, past the keep-alive deadline...
                loop.call_soon_threadsafe(loop.add_reader, stall_rx.fileno(), _stall, loop, stall_rx)
                time.sleep(0.1)
                stall_tx.send(b"x")
                time.sleep(KEEP_ALIVE_S / 2)
                connection.sendall(PROBE)  # ...while the next request is already in the socket
                head = _answer_head(connection)
        assert head.startswith(b"HTTP/1.1 200"), f"the connection was closed under a waiting request: {head!r}"


def test_an_idle_keep_alive_connection_is_still_closed(live_server_factory, read_until_closed):
    with live_server_factory(keep_alive_timeout_s=KEEP_ALIVE_S) as live:
        host, port = live.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as connection:
            connection.sendall(PROBE)
            assert _answer_head(connection).startswith(b"HTTP/1.1 200")
            answered_at = time.monotonic()
            rest, closed_at = read_until_closed(connection, 5.0)
        assert rest == b""
        assert KEEP_ALIVE_S * 0.8 < closed_at - answered_at < KEEP_ALIVE_S + 1.0
