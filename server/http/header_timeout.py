"""408 for request headers that do not arrive in time, so a slowloris client holds no connection.

uvicorn bounds the wait *between* requests on a keep-alive connection, but not
the header block itself: a client that sends ``POST / HTTP/1.1`` and then one
header byte every few seconds keeps its connection (a file descriptor, parser
state, a slot in ``limit_concurrency``) for as long as it likes, and a few
thousand such clients exhaust the server without sending a single request.
``server.http.body_guard`` cannot help: the app only sees a request once its
headers are complete. So the HTTP protocol itself keeps a header clock:

    connection made ──────────────> headers complete     within timeout_s: served as usual
    answer sent, keep-alive idle    (uvicorn's keep-alive timer, unchanged)
    first byte of the next request ──> headers complete  within timeout_s: served as usual
                                    timeout_s passed ──> 408 header_timeout, connection closed

A connection that never sent a byte of its request is closed without an
answer (as an idle keep-alive connection is): nobody asked anything. After a
408 the connection lingers for ``LINGER_S``, dropping what still arrives, so
the answer is read before the close resets the connection. When an
earlier answer on the connection is still being written there is no 408:
that answer finishes and the connection closes after it. While the server itself has
stopped reading (flow control, pipelined requests waiting) the clock does not
run out: the wait is then ours, not the client's.

The same subclass guards uvicorn's keep-alive deadline against a stalled
loop: a connection whose next request already waits in its socket is not idle,
so the deadline does not close it (``timeout_keep_alive_handler``).

uvicorn instantiates the protocol class itself, so the limit travels as a class
attribute of a subclass made by ``header_timeout_protocol``. The subclass
extends the parser uvicorn's ``http="auto"`` would pick: httptools when it is
installed, h11 otherwise; each reports "headers complete" its own way.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import select

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from server.http.disconnect_watch import DisconnectNotice

logger = logging.getLogger(__name__)

LINGER_S = 2.0  # after a 408, how long what the client still sends is read and dropped before closing


def _timeout_answer(timeout_s: float, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """The 408, in the API's error shape, written straight to the transport (no app is involved)."""
    body = json.dumps({"error": {
        "code": "header_timeout",
        "message": f"the request headers did not arrive within {timeout_s:g} s (MMSERVE_HEADER_TIMEOUT_S)",
    }}).encode()
    lines = [b"HTTP/1.1 408 Request Timeout"]
    lines += [name + b": " + value for name, value in default_headers]
    lines += [b"content-type: application/json", b"content-length: " + str(len(body)).encode(),
              b"connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _has_unread_bytes(transport: asyncio.Transport) -> bool:
    """Whether the connection's socket holds bytes (or the client's close) the loop has not read yet."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    readiness = select.poll()
    readiness.register(sock.fileno(), select.POLLIN)
    return bool(readiness.poll(0))


class _HeaderClock:
    """The clock shared by both parsers; each parser's subclass says when headers are awaited and
    stops the clock at its own "headers complete" event.

    Mixed in before the uvicorn protocol class, whose ``transport``, ``flow``,
    ``cycle``, ``loop`` and ``server_state`` it uses.
    """

    header_timeout_s: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None
    _linger_timer: asyncio.TimerHandle | None = None
    _has_request_bytes = False

    def _is_awaiting_headers(self) -> bool:
        raise NotImplementedError

    def _start_header_clock(self, has_request_bytes: bool) -> None:
        """Start the clock unless it runs already (it counts from the first byte, not the last)."""
        self._has_request_bytes = self._has_request_bytes or has_request_bytes
        if self._header_timer is None and self._linger_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._on_header_timeout)

    def _stop_header_clock(self) -> None:
        self._has_request_bytes = False
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # the server is not reading: the wait is ours, not the client's
            self._start_header_clock(has_request_bytes=False)
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # finish the answer being written, then close
            return
        if not self._has_request_bytes:
            self.transport.close()
            return
        client = "%s:%d" % self.client if self.client else "unknown client"
        logger.info("%s: request headers incomplete after %g s, answered 408", client, self.header_timeout_s)
        self.transport.write(_timeout_answer(self.header_timeout_s, self.server_state.default_headers))
        self._linger_then_close()

    def _linger_then_close(self) -> None:
        """Close our side, then discard what the client still sends for a moment before closing.

        Closing a socket with unread bytes makes TCP send a reset, and a reset
        can overtake the 408 on its way, so a client still trickling would
        never read why it was cut off (the "lingering close" of nginx and Apache).
        """
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._linger_timer = self.loop.call_later(LINGER_S, self.transport.close)

    def timeout_keep_alive_handler(self) -> None:
        """uvicorn's keep-alive deadline, except for a connection whose next request already waits unread.

        uvloop runs due timers before it polls the sockets, so after the loop
        stalls (a GIL convoy, a process descheduled on a busy machine) the
        keep-alive timer of a connection can fire before the request that arrived
        meanwhile is read. Closing then would reset the connection under a
        request the client sent on an open connection; instead the deadline
        starts again, and reading the request (next, in the same loop turn) stops it.
        """
        if not self.transport.is_closing() and _has_unread_bytes(self.transport):
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                self.timeout_keep_alive_handler)
            return
        super().timeout_keep_alive_handler()  # type: ignore[misc]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        self._start_header_clock(has_request_bytes=False)

    def data_received(self, data: bytes) -> None:
        if self._linger_timer is not None:
            return  # answered 408 already; the rest is discarded
        if self._is_awaiting_headers():
            self._start_header_clock(has_request_bytes=True)
        super().data_received(data)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_clock()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)  # type: ignore[misc]


class H11HeaderTimeoutProtocol(_HeaderClock, H11Protocol):
    """h11: the client is between requests while its state is IDLE; a ``Request`` event moves it on."""

    def _is_awaiting_headers(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def handle_events(self) -> None:
        super().handle_events()
        if self.transport.is_closing():
            return
        if self.conn.their_state is not h11.IDLE:
            self._stop_header_clock()
        elif self.conn.trailing_data[0]:  # a pipelined request, started while the last one was answered
            self._start_header_clock(has_request_bytes=True)


@functools.cache
def _httptools_protocol() -> type[asyncio.Protocol] | None:
    """The httptools variant, or None where httptools is not installed (uvicorn then uses h11 too)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class HttpToolsHeaderTimeoutProtocol(_HeaderClock, HttpToolsProtocol):
        """httptools: headers are awaited from a message's end (or the connection's start) to
        ``on_headers_complete``; ``on_message_begin`` marks a request starting inside a chunk."""

        _is_awaiting = True

        def _is_awaiting_headers(self) -> bool:
            return self._is_awaiting

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._is_awaiting = True
            self._start_header_clock(has_request_bytes=True)

        def on_headers_complete(self) -> None:
            self._is_awaiting = False
            self._stop_header_clock()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._is_awaiting = True
            super().on_message_complete()

    return HttpToolsHeaderTimeoutProtocol


def header_timeout_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)``: uvicorn's own parser, plus the header clock
    and the per-request disconnect notice (``server.http.disconnect_watch``)."""
    base = _httptools_protocol() or H11HeaderTimeoutProtocol
    return type(base.__name__, (DisconnectNotice, base), {"header_timeout_s": timeout_s, "__doc__": base.__doc__})
