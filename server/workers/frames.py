"""Control messages between API processes and the engine: length-prefixed frames over a Unix socket.

Why this transport: one stream connection per API process, driven by both
sides' asyncio loops, needs nothing beyond the standard library, and is
cheap enough: measured on the 2-core development machine (busy), a text
item's call and a 32-float answer make a round trip in about 66 us, 8 us of
it pickling the call, against the 1.7 ms of CPU a text request costs one
process end to end. ZMQ + msgspec (vLLM's choice) would save part of those
tens of microseconds at the price of two dependencies and typed message
schemas for every item and outcome; worth it once the per-request path is
near the HTTP floor, not before. The frames
hold only control data (items' texts and encoded image bytes, outcomes'
embeddings, error fields): decoded pixels never travel in them, they cross
through shared memory (``server.workers.pixel_slots``). Both ends are
processes of one server started from one interpreter, so the payload is
``pickle`` protocol 5; nothing read from a client is ever unpickled, and no
weights travel this way.

    frame = 4-byte big-endian length | pickle(message)
    message = (kind, call_id, *fields)
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct

_LENGTH = struct.Struct(">I")
MAX_FRAME_BYTES = 1 << 31  # a body is at most MMSERVE_MAX_BODY_BYTES; this only guards a corrupt length


def encode_frame(message: tuple) -> bytes:
    payload = pickle.dumps(message, protocol=5)
    return _LENGTH.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> tuple:
    """The next message; ``asyncio.IncompleteReadError`` when the other side closed the connection."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {length} bytes")
    return pickle.loads(await reader.readexactly(length))


def read_frame_blocking(connection: socket.socket) -> tuple:
    """The next message from a blocking socket (one short admin call)."""
    (length,) = _LENGTH.unpack(_read_exactly(connection, _LENGTH.size))
    return pickle.loads(_read_exactly(connection, length))


def _read_exactly(connection: socket.socket, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = connection.recv(remaining)
        if not chunk:
            raise ConnectionError("the engine closed the connection")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
