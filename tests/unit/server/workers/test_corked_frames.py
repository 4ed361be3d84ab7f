"""Messages written in one event-loop turn leave in one frame and one write, in order; close sends what is queued."""

from __future__ import annotations

import asyncio
import socket

import pytest

from server.workers.frames import CorkedFrameWriter, read_frame, read_messages


class CountingWriter:
    """A real ``asyncio.StreamWriter`` that counts the writes reaching it."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self.num_writes = 0

    def write(self, data: bytes) -> None:
        self.num_writes += 1
        self._writer.write(data)

    def is_closing(self) -> bool:
        return self._writer.is_closing()

    def close(self) -> None:
        self._writer.close()


_OPEN_ENDS: list[object] = []  # the unused halves: a collected StreamWriter closes its socket


async def _connected_pair() -> tuple[asyncio.StreamReader, CountingWriter]:
    ours, theirs = socket.socketpair()
    reader, their_writer = await asyncio.open_unix_connection(sock=theirs)
    our_reader, writer = await asyncio.open_unix_connection(sock=ours)
    _OPEN_ENDS.extend((their_writer, our_reader))
    return reader, CountingWriter(writer)


@pytest.mark.parametrize("num_messages", [3, 15, 16, 70_000])  # the msgpack array header's three sizes
def test_one_turns_messages_leave_in_one_frame_and_one_write_in_order(num_messages: int) -> None:
    async def scenario() -> tuple[list[tuple], int, list[tuple], int]:
        reader, counting = await _connected_pair()
        corked = CorkedFrameWriter(counting)  # type: ignore[arg-type]
        for call_id in range(num_messages):
            corked.write(("run", call_id, f"item {call_id}"))
        assert counting.num_writes == 0  # nothing left during the turn
        first = await read_messages(reader)  # one frame: every message of the turn
        writes_after_first_turn = counting.num_writes
        corked.write(("status", 3))
        second = await read_messages(reader)
        corked.close()
        return first, writes_after_first_turn, second, counting.num_writes

    first, writes_after_first_turn, second, num_writes = asyncio.run(scenario())
    assert first == [("run", call_id, f"item {call_id}") for call_id in range(num_messages)]
    assert writes_after_first_turn == 1
    assert second == [("status", 3)]
    assert num_writes == 2


def test_a_value_no_frame_carries_fails_its_writer_not_the_turn() -> None:
    async def scenario() -> list[tuple]:
        reader, counting = await _connected_pair()
        corked = CorkedFrameWriter(counting)  # type: ignore[arg-type]
        corked.write(("ok", 1, None))
        with pytest.raises(TypeError):
            corked.write(("ok", 2, object()))
        corked.write(("ok", 3, None))
        return await read_messages(reader)

    assert asyncio.run(scenario()) == [("ok", 1, None), ("ok", 3, None)]


def test_close_sends_what_the_turn_queued() -> None:
    async def scenario() -> list[tuple]:
        reader, counting = await _connected_pair()
        corked = CorkedFrameWriter(counting)  # type: ignore[arg-type]
        corked.write(("cancelled", 7))
        corked.close()
        return [await read_frame(reader)]

    assert asyncio.run(scenario()) == [("cancelled", 7)]
