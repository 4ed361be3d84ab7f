"""One engine's connection in an API process: its calls and answers, its state and load, and its return.

An API process holds one ``EngineConnection`` per engine
(``server.workers.engine_client`` sends each request to one of them). Each
polls its engine's state every ``STATUS_PERIOD_S``:

    ready, alive, draining     whether the engine serves (``server.workers.engine_router`` reads them)
    waits                      per lane, the time the engine's scheduler needs to drain what is queued
                               (``router.Router.estimated_waits_s``): the load dispatch compares
                               (``server.workers.engine_dispatch``), as the engine measures it

An engine that dies fails only the calls this connection had sent it (503
``engine_unavailable``, retriable); the connection then tries again every
``RECONNECT_PERIOD_S`` until the engine the supervisor starts again listens,
and serves from its first status poll that says ready.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable

from server.errors import ApiError
from server.workers.frames import CorkedFrameWriter, encode_frame, read_frame, read_messages

logger = logging.getLogger(__name__)

STATUS_PERIOD_S = 0.2
RECONNECT_PERIOD_S = 0.2


@dataclasses.dataclass(frozen=True)
class EngineGone:
    """Why an engine's connection is down (``message`` is what an operator reads)."""

    message: str


async def open_engine_connection(socket_path: str,
                                 timeout_s: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to an engine, retried until ``timeout_s`` (an engine listens once its model is loaded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await asyncio.open_unix_connection(socket_path)
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


class EngineConnection:
    """One engine: its socket, the calls awaiting its answers, its last polled state and load.

    ``on_faults``: where the drills this engine pushes go (only engine 0's
    connection watches them: every drill change is made on every engine).
    """

    def __init__(self, index: int, socket_path: str, on_faults: Callable[[object], None] | None = None) -> None:
        self.index = index
        self.socket_path = socket_path
        self._on_faults = on_faults
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future] = {}
        self._writer: CorkedFrameWriter | None = None
        self._tasks: list[asyncio.Task] = []
        self._is_closed = False
        self.engine_status = (False, True, False)  # ready, alive, draining
        self.waits_s: dict[str, float] = {}  # per lane, as the engine last reported
        self.fault: EngineGone | None = None
        self.num_in_flight = 0  # this process's calls to this engine not yet answered
        self.on_status: Callable[[], None] | None = None

    @property
    def is_serving(self) -> bool:
        ready, alive, draining = self.engine_status
        return self.fault is None and ready and alive and not draining

    def wait_s(self, lane: str) -> float:
        return self.waits_s.get(lane, 0.0)

    @property
    def is_connected(self) -> bool:
        return self.fault is None and self._writer is not None

    async def connect(self, timeout_s: float) -> None:
        """Connect (the engine may still be loading its model: retry until ``timeout_s``), then poll its state;
        an engine not listening by then is connected to later, as one started again is."""
        try:
            await self._open(timeout_s)
        except (OSError, ApiError) as e:  # nothing was sent to it yet: nothing fails, the poll connects later
            self.fault = EngineGone(f"engine {self.index} is not listening ({type(e).__name__})")
            logger.warning("%s: connecting to it once it listens", self.fault.message)
        self._tasks.append(asyncio.create_task(self._poll_status()))

    async def _open(self, timeout_s: float) -> None:
        reader, writer = await open_engine_connection(self.socket_path, timeout_s)
        self._writer = CorkedFrameWriter(writer)
        self.fault = None
        self._tasks.append(asyncio.create_task(self._read_answers(reader)))
        if self._on_faults is not None:
            await self.call("watch_faults")  # the drills now arrive before its answer, and after every change

    async def close(self) -> None:
        self._is_closed = True
        for task in self._tasks:
            task.cancel()
        if self._writer is not None:
            self._writer.close()

    async def _read_answers(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                for kind, call_id, *fields in await read_messages(reader):  # a turn of the engine's answers
                    if kind == "faults":  # unasked: the drills changed
                        if self._on_faults is not None:
                            self._on_faults(fields[0])
                        continue
                    future = self._waiting.pop(call_id, None)
                    if future is not None and not future.done():
                        future.set_result((kind, fields))
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            self._gone(EngineGone(f"engine {self.index} closed its connection ({type(e).__name__})"))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a broken stream is the engine gone
            self._gone(EngineGone(f"engine {self.index}'s connection broke: {e}"))

    def _gone(self, fault: EngineGone) -> None:
        """The engine died: its calls fail (retriable), and the connection waits for the one started again."""
        self.fault = fault
        self.engine_status = (False, True, False)
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(_unavailable(self.index))
        if not self._is_closed:
            logger.error("%s: its requests in flight failed; connecting again once it is back", fault.message)

    def send(self, *message: object) -> tuple[int, asyncio.Future]:
        if self.fault is not None or self._writer is None:
            raise _unavailable(self.index)
        call_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        self._writer.write((message[0], call_id, *message[1:]))
        return call_id, future

    def write(self, *message: object) -> None:
        """A message the engine does not answer (a record, spans, a cancel); dropped while the engine is gone."""
        if self.fault is None and self._writer is not None:
            self._writer.write((message[0], next(self._ids), *message[1:]))

    def cancel(self, call_id: int) -> None:
        if self.fault is None and self._writer is not None:
            self._writer.write(("cancel", call_id))  # the engine answers "cancelled" to the call itself

    async def call(self, *message: object) -> object:
        _, future = self.send(*message)
        kind, fields = await future
        return fields[0]

    async def _poll_status(self) -> None:
        while not self._is_closed:
            if self.fault is not None:
                await self._reconnect()
                continue
            try:
                ready, alive, draining, waits = await self.call("status")  # type: ignore[misc]
                self.engine_status, self.waits_s = (ready, alive, draining), waits
            except ApiError:
                continue  # gone meanwhile: reconnect above
            if self.on_status is not None:
                self.on_status()
            await asyncio.sleep(STATUS_PERIOD_S)

    async def _reconnect(self) -> None:
        if self.on_status is not None:
            self.on_status()
        await asyncio.sleep(RECONNECT_PERIOD_S)
        try:
            await self._open(0.0)
            logger.info("engine %d is back: connected again", self.index)
        except (OSError, ApiError):
            pass


def _unavailable(index: int) -> ApiError:
    return ApiError(503, "engine_unavailable", f"engine {index} is not serving (it is starting again)",
                    retry_after_s=1.0)


async def describe_engine(socket_path: str, timeout_s: float) -> tuple:
    """An engine's answer to ``describe`` (one short connection): what ``engine_client.describe_engine`` checks."""
    reader, writer = await open_engine_connection(socket_path, timeout_s)
    try:
        writer.write(encode_frame(("describe", 0)))
        return await read_frame(reader)
    finally:
        writer.close()


def call_engine_blocking(socket_path: str, *message: object, timeout_s: float = 10.0) -> tuple:
    """One call on a blocking connection of its own: the answer's ``(kind, call_id, *fields)`` (an operator's
    call, rare; or a benchmark asking an engine it started)."""
    import socket

    from server.workers.frames import read_frame_blocking

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(timeout_s)
        connection.connect(socket_path)
        connection.sendall(encode_frame((message[0], 0, *message[1:])))
        return read_frame_blocking(connection)


def clear_engine_cache(socket_path: str) -> int:
    """``DELETE /v1/cache`` on one engine: a blocking round trip on its own short connection (an operator's
    call, rare, well under a millisecond); the entries it removed."""
    return call_engine_blocking(socket_path, "clear_cache")[2]
