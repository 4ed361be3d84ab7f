"""An API process's pixel slot is not handed out again while a decode of a call that ended still writes into it.

The client of a call can go away while its images are being decoded in the
pool; the call then ends at once, but a decode already running cannot be
stopped and will still write its pixels. Its slot goes back when that decode
is done, not when the call ends, so no other request's pixels are overwritten.
The decoder here is the real one (``server.ingest.inputs.decode_image``),
held at its start by an event so the test decides when it runs.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from encoded_images import encoded_image
from models.loading.config import PreprocessConfig
from router.intake import IntakeItem
from router.segments import ImageContent, SegmentCatalog
from server.errors import ApiError
from server.ingest.inputs import decode_image
from server.workers.engine_client import EngineClient
from server.workers.pixel_slots import PixelSlots


def test_a_running_decode_keeps_its_slot_until_it_is_done_and_a_queued_one_gives_it_back_at_once():
    started, release = threading.Event(), threading.Event()

    def held_decoder(data: bytes):  # noqa: ANN202 - whatever the real decoder returns
        started.set()
        release.wait(10)
        return decode_image(data)

    slots = PixelSlots((8, 8, 3), num_slots=4)
    pool = ThreadPoolExecutor(1)  # one thread: the second image's decode waits in the queue
    client = EngineClient("/nonexistent", SegmentCatalog(None, "fp", "size=8"),  # type: ignore[arg-type]
                          PreprocessConfig(input_size=8, resize_size=8), held_decoder, pool, slots,
                          texts=None, is_image_cache_on=False,  # type: ignore[arg-type]  # no peek: no engine
                          inline_image_max_pixels=0)  # the pool's path, whatever the images' size
    items = [IntakeItem(f"r-{seed}", images=(ImageContent(encoded=encoded_image(seed, (12, 10), "PNG")),))
             for seed in (1, 2)]
    taken: list[int] = []

    async def scenario() -> None:
        call = asyncio.ensure_future(client.decode_into_slots(items, taken))
        while not started.is_set():
            await asyncio.sleep(0.01)
        call.cancel()  # the client went away
        try:
            await call
        except asyncio.CancelledError:
            pass
        client.give_back_slots(taken)  # what every caller does when the call ends

    try:
        asyncio.run(scenario())
        assert len(slots.take(slots.num_slots - 1)) == 3  # all but the one still being written, the queued one's too
        with pytest.raises(ApiError):
            slots.take(1)  # that one is not handed out while its decode writes into it
        release.set()
        pool.shutdown(wait=True)  # the running decode is done: its slot is back
        assert len(slots.take(1)) == 1
    finally:
        release.set()
        pool.shutdown(wait=True)
        slots.close()
