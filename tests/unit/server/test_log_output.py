"""Log lines of one event-loop turn are written together, in order, and never held past that turn."""

from __future__ import annotations

import asyncio
import io
import logging
import threading

import pytest

from server.runtime.log_output import SecondFormatter, TurnBufferedStreamHandler


class CountedStream(io.StringIO):
    """A text stream that counts its writes (one write is one system call on stderr)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_writes = 0

    def write(self, text: str) -> int:
        self.num_writes += 1
        return super().write(text)


@pytest.fixture
def logged():
    stream = CountedStream()
    handler = TurnBufferedStreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("test_log_output")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, stream, handler
    logger.removeHandler(handler)


def test_one_turns_lines_are_one_write_at_the_next_turn(logged):
    logger, stream, _ = logged

    async def scenario() -> tuple[str, str]:
        for name in ("a", "b", "c"):
            logger.info("request %s", name)
        during_turn = stream.getvalue()
        await asyncio.sleep(0)  # the next turn
        return during_turn, stream.getvalue()

    during_turn, after_turn = asyncio.run(scenario())
    assert during_turn == ""
    assert after_turn == "INFO request a\nINFO request b\nINFO request c\n" and stream.num_writes == 1


def test_a_warning_and_lines_off_the_loop_are_written_at_once_after_what_is_kept(logged):
    logger, stream, _ = logged

    async def scenario() -> str:
        logger.info("kept")
        logger.warning("now")
        return stream.getvalue()

    assert asyncio.run(scenario()) == "INFO kept\nWARNING now\n"
    thread = threading.Thread(target=logger.info, args=("from a compute thread",))
    thread.start()
    thread.join()
    assert stream.getvalue().endswith("INFO from a compute thread\n")


def test_flush_writes_what_is_kept_and_a_new_loop_schedules_its_own_flush(logged):
    logger, stream, handler = logged

    loop = asyncio.new_event_loop()
    loop.call_soon(logger.info, "before the loop closed")
    loop.call_soon(loop.stop)  # the same turn: the flush scheduled for the next one never runs
    loop.run_forever()
    loop.close()
    assert stream.getvalue() == ""
    handler.flush()  # logging.shutdown at exit does this
    assert stream.getvalue() == "INFO before the loop closed\n"

    async def another_loop() -> None:
        logger.info("on a new loop")
        await asyncio.sleep(0)

    asyncio.run(another_loop())
    assert stream.getvalue().endswith("INFO on a new loop\n")


@pytest.mark.parametrize("created", [1764763200.0, 1764763200.5004, 1764763200.999, 1764763201.0015, 1764763199.25])
def test_the_time_formatted_once_a_second_reads_as_loggings_own(created):
    line_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    once_a_second = SecondFormatter(line_format)
    once_a_second.format(_record_at(created - 1.5))  # a second cached before: a new second formats again
    for at in (created, created + 0.0004):  # the second cached, the same second again
        record = _record_at(at)
        assert once_a_second.format(record) == logging.Formatter(line_format).format(record)


def _record_at(created: float) -> logging.LogRecord:
    record = logging.LogRecord("mmserve.test", logging.INFO, __file__, 1, "request %s", ("r-1",), None)
    record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
    return record
