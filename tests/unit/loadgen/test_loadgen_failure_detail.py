"""A failed request says why: the error answer's code and message, or the exception chain of a broken connection.

A soak of half a million requests that ends with two transport errors is only
worth something if the two can be explained afterwards, so each sample keeps
its failure's detail and the soak groups them. The servers here are raw
sockets on 127.0.0.1 that answer an error or reset the connection, since a
real server does either only under conditions a test cannot arrange.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from benchmarks.loadgen.connection_slots import ConnectionSlots
from benchmarks.loadgen.request_spec import Modality
from benchmarks.loadgen.runner import OUTCOME_TRANSPORT_ERROR, Sample, Sender, error_code_of, exception_chain
from benchmarks.soak import failures_report
from benchmarks.soak import main as soak_main

OVERLOADED_BODY = b'{"error": {"code": "overloaded", "message": "the vision lane is full (64)"}}'
OVERLOADED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
              b"content-length: %d\r\n\r\n%s" % (len(OVERLOADED_BODY), OVERLOADED_BODY))


def _answer_with(payload: bytes) -> Callable[[socket.socket], None]:
    def answer(connection: socket.socket) -> None:
        connection.sendall(payload)
    return answer


def _reset(connection: socket.socket) -> None:
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST


@contextmanager
def _raw_server(handle: Callable[[socket.socket], None]) -> Iterator[str]:
    """Accepts one connection, reads its request, hands it to ``handle``, then closes it."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            handle(connection)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        thread.join(timeout=5)
        listener.close()


def _one_sample(url: str) -> Sample:
    samples: list[Sample] = []

    async def send() -> None:
        slots = ConnectionSlots(url, timeout_s=5.0)
        try:
            await Sender(slots, 0.0, 5.0, samples.append).send(Modality.TEXT, b'{"text": "a cat"}', 0.0)
        finally:
            await slots.aclose()

    asyncio.run(send())
    return samples[0]


def test_an_error_answer_keeps_its_code_and_message():
    with _raw_server(_answer_with(OVERLOADED)) as url:
        sample = _one_sample(url)
    assert (sample.outcome, sample.status, sample.detail) == ("503", 503, "overloaded: the vision lane is full (64)")


def test_a_reset_connection_keeps_the_exception_chain():
    with _raw_server(_reset) as url:
        sample = _one_sample(url)
    assert sample.outcome == OUTCOME_TRANSPORT_ERROR
    assert "ConnectionResetError" in sample.detail or "reset" in sample.detail.lower(), sample.detail


def test_the_chain_goes_outermost_first_and_an_answer_without_a_code_has_none():
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError as inner:
            raise OSError("read failed") from inner
    except OSError as outer:
        assert exception_chain(outer) == "OSError: read failed <- ConnectionResetError: [Errno 104] Connection reset by peer"
    assert error_code_of(b'{"detail": "Not Found"}') == error_code_of(b"<html>bad gateway</html>") == ""
    assert error_code_of(b'{"error": {"code": "not_ready"}}') == "not_ready"


def test_the_soak_groups_failures_by_outcome_and_detail_numbers_aside_most_first():
    def sample(outcome: str, detail: str, done_s: float) -> Sample:
        return Sample(Modality.TEXT, "text", 0.0, 0.0, done_s, 0 if outcome == "transport_error" else 503, outcome,
                      detail)

    samples = [sample("ok", "", 1.0), sample("503", "overloaded: 64 wait; retry in 0.3 s", 4.0),
               sample("503", "overloaded: 64 wait; retry in 1.2 s", 9.5),
               sample("transport_error", "ReadError <- ConnectionResetError", 7.0)]
    assert failures_report(samples).splitlines()[1:] == [
        "  503: 2, at 4.0 .. 9.5 s; overloaded: 64 wait; retry in 0.3 s",
        "  transport_error: 1, at 7.0 .. 7.0 s; ReadError <- ConnectionResetError",
    ]
    assert failures_report(samples[:1]) == ""


def test_the_soak_still_has_its_command_line(capsys):
    """``python -m benchmarks.soak`` is how BENCHMARKS.md's soaks are run: its entry point must stay."""
    with pytest.raises(SystemExit) as exited:
        soak_main(["--help"])
    assert exited.value.code == 0
    assert "--api-workers" in capsys.readouterr().out
