"""A call whose client goes away while its images decode holds no pixel slot, and its queued decodes never run.

Slots are taken only as the call is sent (``EngineClient.put_pixels``), so a
decode still running when its call ends writes into its own array, never into
a slot another request may hold; a decode still waiting for a pool thread is
dropped. The decoder here is the real one (``server.ingest.inputs.decode_image``),
held at its start by an event so the test decides when it runs.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from encoded_images import encoded_image
from models.loading.config import PreprocessConfig
from router.intake import IntakeItem
from router.segments import ImageContent, SegmentCatalog
from server.ingest.inputs import decode_image
from server.workers.engine_client import EngineClient
from server.workers.pixel_slots import PixelSlots


def test_a_cancelled_decode_takes_no_slot_and_its_queued_decode_never_runs():
    started, release = threading.Event(), threading.Event()
    num_decoded = 0

    def held_decoder(data: bytes):  # noqa: ANN202 - whatever the real decoder returns
        nonlocal num_decoded
        started.set()
        release.wait(10)
        num_decoded += 1
        return decode_image(data)

    slots = PixelSlots((8, 8, 3), num_slots=4)
    pool = ThreadPoolExecutor(1)  # one thread: the second image's decode waits in the queue
    client = EngineClient("/nonexistent", SegmentCatalog(None, "fp", "size=8"),  # type: ignore[arg-type]
                          PreprocessConfig(input_size=8, resize_size=8), held_decoder, pool, slots,
                          texts=None, is_image_cache_on=False,  # type: ignore[arg-type]  # no peek: no engine
                          inline_image_max_pixels=0)  # the pool's path, whatever the images' size
    items = [IntakeItem(f"r-{seed}", images=(ImageContent(encoded=encoded_image(seed, (12, 10), "PNG")),))
             for seed in (1, 2)]

    async def scenario() -> None:
        call = asyncio.ensure_future(client.decode_pixels(items, client.engines[0]))
        while not started.is_set():
            await asyncio.sleep(0.01)
        assert slots.num_held == 0, "decoding takes no slot"
        call.cancel()  # the client went away
        try:
            await call
        except asyncio.CancelledError:
            pass

    try:
        asyncio.run(scenario())
        release.set()
        pool.shutdown(wait=True)
        assert num_decoded == 1, "the decode waiting for a thread was dropped"
        assert slots.num_held == 0
        assert slots.put([np.zeros((8, 8, 3), np.uint8)] * 4) == [0, 1, 2, 3], "every slot is free"
    finally:
        release.set()
        pool.shutdown(wait=True)
        slots.close()
