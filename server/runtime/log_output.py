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

``configure_logging`` sets up a serving process: this handler (or a plain
one), a formatter that formats the time once a second, and none of the
lookups a record makes for fields no mmserve line shows (the caller's file
and line, thread, process: the logging HOWTO's "Optimization"). Under load
those were about a third of an access line's cost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TextIO


def configure_logging(level: str, line_format: str, *, turn_buffered: bool = True) -> None:
    """The root logger of a serving process: ``line_format`` at ``level`` on stderr.

    ``line_format`` may use the time, level, logger name and message (what
    mmserve's lines show), not the caller, thread or process fields, which
    records made after this call leave unset.
    """
    handler = TurnBufferedStreamHandler() if turn_buffered else logging.StreamHandler()
    handler.setFormatter(SecondFormatter(line_format))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    logging._srcfile = None  # noqa: SLF001 - the HOWTO's way to skip looking up the caller's frame
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


class SecondFormatter(logging.Formatter):
    """A ``Formatter`` that formats a record's time of day once a second, then adds its milliseconds.

    ``Formatter.formatTime`` converts and ``strftime``s every record's time;
    an access line per request would do that thousands of times a second for
    the same second. The text is the default format's, as ``Formatter`` writes it.
    """

    def __init__(self, fmt: str | None = None) -> None:
        super().__init__(fmt)
        self._second_text: tuple[int, str] = (-1, "")  # one tuple, replaced whole: safe across handlers' threads

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        cached_second, text = self._second_text
        if second != cached_second:
            text = time.strftime(self.default_time_format, self.converter(record.created))
            self._second_text = (second, text)
        return self.default_msec_format % (text, record.msecs)


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
