"""The server's log lines on stderr, written once per event-loop turn rather than once per line.

The access log (``server.http.access_log``) writes a line for every inference
request, and a plain ``StreamHandler`` writes and flushes each line at once:
one ``write`` system call per request, which on a busy server costs about as
much as sending the answer itself. This handler keeps the lines one turn of
the event loop produces and writes them together as the next turn starts
(``loop.call_soon``). The compute thread settles a batch in one turn, so a
batch of 8 answered requests is one write, not 8:

    turn n     request a answered -> line a kept      flush scheduled (call_soon)
               request b answered -> line b kept
    turn n+1   flush: "line a\\nline b\\n", one write

A line is never held longer than that turn. Lines logged off the event loop
(compute threads, start-up, shutdown) and every line at WARNING or above are
written at once, after whatever is still kept, so the order of lines is the
order they were logged. ``flush`` (``logging.shutdown`` at exit) writes what
is kept.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TextIO


class TurnBufferedStreamHandler(logging.StreamHandler):
    """A ``StreamHandler`` (stderr by default) that writes an event-loop turn's INFO and DEBUG lines at once."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream)
        self._kept: list[str] = []
        self._flush_loop: asyncio.AbstractEventLoop | None = None  # where the flush of ``_kept`` is scheduled

    def emit(self, record: logging.LogRecord) -> None:
        """Runs under the handler's lock (``Handler.handle``)."""
        try:
            self._kept.append(self.format(record) + self.terminator)
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # a thread without an event loop: as a StreamHandler does
                loop = None
            if loop is None or record.levelno >= logging.WARNING:
                self._write_kept()
            elif self._flush_loop is not loop:  # not yet scheduled on this loop (or its loop is gone)
                self._flush_loop = loop
                loop.call_soon(self._flush_turn)
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - logging never raises into the caller
            self.handleError(record)

    def _flush_turn(self) -> None:
        self.acquire()
        try:
            self._flush_loop = None
            self._write_kept()
        finally:
            self.release()

    def _write_kept(self) -> None:
        if self._kept:
            text = "".join(self._kept)
            self._kept.clear()
            self.stream.write(text)
        super().flush()

    def flush(self) -> None:
        self.acquire()
        try:
            self._write_kept()
        finally:
            self.release()
