"""A call whose client goes away is cancelled in the engine by its own id, and leaves nothing waiting.

The engine finds the task to cancel by the id of the call it answers
(``("cancel", call_id)``); a cancel sent as a call of its own carried a fresh
id the engine never knew, so the engine kept computing, and its future was
never answered.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from models.loading.config import PreprocessConfig
from router.segments import SegmentCatalog
from server.workers.engine_client import EngineClient
from server.workers.pixel_slots import PixelSlots


class RecordingWriter:
    """Stands where the corked writer does: keeps each message written."""

    def __init__(self) -> None:
        self.messages: list[tuple] = []

    def write(self, message: tuple) -> None:
        self.messages.append(message)


def test_a_cancelled_call_sends_a_cancel_with_its_own_id():
    slots = PixelSlots((8, 8, 3), num_slots=4)
    client = EngineClient("/nonexistent", SegmentCatalog(None, "fp", "size=8"),  # type: ignore[arg-type]
                          PreprocessConfig(input_size=8, resize_size=8), None, ThreadPoolExecutor(1),  # type: ignore[arg-type]
                          slots, texts=None)  # type: ignore[arg-type]
    writer = RecordingWriter()
    engine = client.engines[0]
    engine._writer = writer  # type: ignore[assignment]  # connected, as far as sending goes

    async def scenario() -> None:
        call = asyncio.ensure_future(client.call_with_slots(engine, [[0]], "run", ["item"], 1, slots.name, [[0]]))
        await asyncio.sleep(0)
        call.cancel()  # the client went away
        try:
            await call
        except asyncio.CancelledError:
            pass

    try:
        asyncio.run(scenario())
        (run_kind, call_id, *_), cancel = writer.messages
        assert run_kind == "run"
        assert cancel == ("cancel", call_id)
        assert list(engine._waiting) == [call_id], "only the call itself waits, for the engine's 'cancelled'"
    finally:
        slots.close()
