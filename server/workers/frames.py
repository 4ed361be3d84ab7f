"""Control messages between API processes and the engine: length-prefixed frames over a Unix socket.

Why this transport: one stream connection per API process, driven by both
sides' asyncio loops, needs one small dependency (msgpack) and is cheap
enough: measured with timeit on the 2-core development machine (busy),
encoding and decoding a text item's call costs about 15 us and its answer
(one outcome: a 32-float embedding, tokens, facts) about 65 us, some 20 us
more per round trip than ``pickle`` protocol 5 did, against the 1.7 ms of
CPU a text request costs one process end to end. ZMQ + msgspec (vLLM's
choice) would save part of that at the price of another dependency and
typed schemas for every item and outcome; worth it once the per-request
path is near the HTTP floor, not before. The frames hold only control data
(items' texts and encoded image bytes, outcomes' embeddings, error fields):
decoded pixels never travel in them, they cross through shared memory
(``server.workers.pixel_slots``).

Both ends are processes of one server, yet the payload is not a general
object serialisation: ``server.workers.frame_codec`` builds only the plain
values and the registered dataclasses, enums and numeric arrays the calls
carry, so a byte stream on the socket cannot make any other object (no
pickle anywhere on this path; no weights travel this way).

    frame = 4-byte big-endian length | msgpack(message)          one message
          | 4-byte big-endian length | msgpack([message, ...])   a turn's messages (``CorkedFrameWriter``)
    message = (kind, call_id, *fields)

A message is always a tuple (an array led by the codec's tuple tag), so a
payload that decodes to a list is a turn's messages; ``read_messages`` gives
either as a list.
"""

from __future__ import annotations

import asyncio
import socket
import struct

from server.workers.frame_codec import decode, encode, packer

_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 1 << 31  # a body is at most MMSERVE_MAX_BODY_BYTES; this only guards a corrupt length


def encode_frame(message: tuple) -> bytes:
    payload = encode(message)
    return _LENGTH.pack(len(payload)) + payload


def _frame_of_payloads(payloads: list[bytes]) -> bytes:
    """One frame holding several messages already encoded: a msgpack array header, then their payloads."""
    count = len(payloads)
    header = bytes((0x90 | count,)) if count < 16 else b"\xdc" + count.to_bytes(2, "big") if count < 1 << 16 \
        else b"\xdd" + count.to_bytes(4, "big")
    size = len(header) + sum(map(len, payloads))
    return b"".join((_LENGTH.pack(size), header, *payloads))


async def read_frame(reader: asyncio.StreamReader) -> tuple:
    """The next frame's message (a frame of one); ``asyncio.IncompleteReadError`` when the other side closed."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {length} bytes")
    return decode(await reader.readexactly(length))


async def read_messages(reader: asyncio.StreamReader) -> list[tuple]:
    """The next frame's messages, in the order they were written (one, or a turn's)."""
    message = await read_frame(reader)
    if type(message) is list:
        if not all(type(each) is tuple for each in message):
            raise ValueError("a frame of messages holds something other than messages")
        return message
    return [message]


class CorkedFrameWriter:
    """A connection's messages, those written during one turn of the event loop leaving in one frame.

    Each write to the Unix socket is a system call that, when the other process
    sleeps in its event loop, also wakes it; on the development machine (a VM)
    that made the API process's frame writes about a fifth of its CPU under load,
    one per request. Under load one turn of the loop produces several requests'
    messages (calls and latency records in an API process, answers in the
    engine): they now leave together, at the start of the next turn, in one
    frame, which the other side reads and decodes at once (``read_messages``):
    one length, one ``readexactly`` pair and one msgpack pass for the turn
    instead of one per message, which is where the engine, the one process
    every request passes, spends a share of each request. Each message is
    encoded as it is written (a value no frame carries fails its writer, not
    the turn). Order is kept; nothing waits longer than that turn.
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._loop = asyncio.get_running_loop()
        self._pending: list[bytes] = []
        self._pack = packer().pack  # used on the loop's thread only

    def write(self, message: tuple) -> None:
        """Queue ``message`` (on the loop's thread); it leaves with the turn's others."""
        payload = self._pack(message)
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(payload)

    def reply(self, *message: object) -> None:
        """``write`` the message unless the connection is closing: an answer to a peer that went away is dropped."""
        if not self._writer.is_closing():
            self.write(message)

    def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        if not self._writer.is_closing():
            self._writer.write(_LENGTH.pack(len(pending[0])) + pending[0] if len(pending) == 1
                               else _frame_of_payloads(pending))

    def is_closing(self) -> bool:
        return self._writer.is_closing()

    def close(self) -> None:
        self.flush()
        self._writer.close()


def read_frame_blocking(connection: socket.socket) -> tuple:
    """The next message from a blocking socket (one short admin call)."""
    (length,) = _LENGTH.unpack(_read_exactly(connection, _LENGTH.size))
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {length} bytes")
    return decode(_read_exactly(connection, length))


def _read_exactly(connection: socket.socket, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = connection.recv(remaining)
        if not chunk:
            raise ConnectionError("the engine closed the connection")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
