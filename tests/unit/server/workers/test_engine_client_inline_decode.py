"""An API process decodes a call's small images on its event loop, and a call over the limit in the pool.

The same rule as the intake's (``router.inline_decode``), on the real decoder:
the pixels decoded on the loop are the model input the pool's path decodes.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor, ThreadPoolExecutor

import numpy as np
import pytest

from encoded_images import encoded_image
from models.loading.config import PreprocessConfig
from models.preprocessing import resize_to_model_input
from router.intake import IntakeItem
from router.segments import ImageContent, SegmentCatalog
from server.ingest.inputs import image_decoder
from server.settings import Settings
from server.workers.engine_client import EngineClient
from server.workers.pixel_slots import PixelSlots

PREPROCESS = PreprocessConfig(input_size=8, resize_size=8)
decode_image = image_decoder(Settings(), PREPROCESS)  # the server's decoder


class NoPool(Executor):
    def submit(self, fn, /, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003 - Executor's signature
        raise AssertionError("a small image went to the pool")


def _decoded(items: list[IntakeItem], executor: Executor, limit: int) -> list[np.ndarray]:
    slots = PixelSlots((8, 8, 3), num_slots=4)
    client = EngineClient("/nonexistent", SegmentCatalog(None, "fp", "size=8"),  # type: ignore[arg-type]
                          PREPROCESS, decode_image, executor, slots, texts=None,  # type: ignore[arg-type]
                          is_image_cache_on=False, inline_image_max_pixels=limit)  # no peek: no engine
    try:
        pixels = asyncio.run(client.decode_pixels(items, client.engines[0]))
        return [image for item_pixels in pixels for image in item_pixels]
    finally:
        slots.close()


def test_small_images_are_decoded_on_the_loop_into_the_pixels_the_pool_writes():
    images = [encoded_image(seed, (12, 10), "PNG") for seed in (1, 2)]  # 120 pixels each
    items = [IntakeItem(f"r-{index}", images=(ImageContent(encoded=image),)) for index, image in enumerate(images)]
    expected = [resize_to_model_input(decode_image(image), PREPROCESS) for image in images]
    on_the_loop = _decoded(items, NoPool(), limit=240)
    with ThreadPoolExecutor(2) as pool:
        in_the_pool = _decoded(items, pool, limit=239)  # one pixel over, counted together
    for got_loop, got_pool, want in zip(on_the_loop, in_the_pool, expected, strict=True):
        np.testing.assert_array_equal(got_loop, want)
        np.testing.assert_array_equal(got_pool, want)
    with pytest.raises(AssertionError, match="went to the pool"):
        _decoded(items, NoPool(), limit=239)
