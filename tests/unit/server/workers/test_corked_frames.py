"""Frames written in one event-loop turn leave in one write, in order, and close sends what is queued."""

from __future__ import annotations

import asyncio
import socket

from server.workers.frames import CorkedFrameWriter, read_frame


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


def test_one_turns_frames_leave_in_one_write_in_order() -> None:
    async def scenario() -> tuple[list[tuple], int, list[tuple], int]:
        reader, counting = await _connected_pair()
        corked = CorkedFrameWriter(counting)  # type: ignore[arg-type]
        for call_id in range(3):
            corked.write(("run", call_id, f"item {call_id}"))
        assert counting.num_writes == 0  # nothing left during the turn
        first = [await read_frame(reader) for _ in range(3)]
        writes_after_first_turn = counting.num_writes
        corked.write(("status", 3))
        second = [await read_frame(reader)]
        corked.close()
        return first, writes_after_first_turn, second, counting.num_writes

    first, writes_after_first_turn, second, num_writes = asyncio.run(scenario())
    assert first == [("run", 0, "item 0"), ("run", 1, "item 1"), ("run", 2, "item 2")]
    assert writes_after_first_turn == 1
    assert second == [("status", 3)]
    assert num_writes == 2


def test_close_sends_what_the_turn_queued() -> None:
    async def scenario() -> list[tuple]:
        reader, counting = await _connected_pair()
        corked = CorkedFrameWriter(counting)  # type: ignore[arg-type]
        corked.write(("cancelled", 7))
        corked.close()
        return [await read_frame(reader)]

    assert asyncio.run(scenario()) == [("cancelled", 7)]
