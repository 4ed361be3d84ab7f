"""The API process's decode: every image the engine does not hold, to the model's (S, S, 3) uint8 input.

    drill       a ``decode`` fault drill's delay for each item, in the decode pool
                (the engine runs none for calls from here: no item is delayed twice)
    peek        ask the engine which images' segments it holds (no claim; none asked
                while its image cache is off or no item uses the cache)
    decode      only the others: on the event loop when the call's images are together
                small enough (router.inline_decode), else in this process's decode pool

``EngineClient`` (``server.workers.engine_client``) calls it for ``/v1/infer``
and the other intake calls, and through ``decode_pixels`` for the zero-shot
routes; the pixels then go into shared-memory slots. A bad image is named as
the single process's intake names it: ``ImageItemError`` for an item that
sent a list, inside ``IntakeItemError`` with the item's index.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor, Future

import numpy as np

from models.loading.config import PreprocessConfig
from models.preprocessing import pixels_to_model_input, resize_to_model_input
from router.errors import ImageItemError, IntakeItemError
from router.faults import FaultInjector
from router.image_header import image_pixels, images_encoding
from router.inline_decode import decodes_inline
from router.intake import ImageDecoder, IntakeItem
from router.segments import ImageContent, SegmentCatalog, SegmentKey

Peek = Callable[[list], Awaitable[object]]
"""The engine's answer to a peek: for each image key (``None``: not asked), whether it holds the segment."""


class MissingImages:
    """Decodes what the engine lacks; built once per API process with its decode pool and the engine's facts."""

    def __init__(self, catalog: SegmentCatalog, preprocess: PreprocessConfig, decode_image: ImageDecoder,
                 executor: Executor, faults: FaultInjector | None, is_image_cache_on: bool,
                 inline_image_max_pixels: int) -> None:
        self._catalog = catalog  # keys only: the cache is the engine's
        self._preprocess = preprocess
        self._decode_image = decode_image
        self._executor = executor
        self._faults = faults  # a copy of the engine's drills, kept by the engine's pushes
        # With the engine's image cache off nothing can be held there: no keys, no peek round trip.
        self._is_image_cache_on = is_image_cache_on
        self._inline_image_max_pixels = inline_image_max_pixels  # smaller items decode on the loop (intake's rule)

    async def drill(self, items: Sequence[IntakeItem]) -> None:
        """A ``decode`` drill's delay for each item, in the decode pool (``server.workers.engine_client``)."""
        if self._faults is None:
            return
        delays = [self._executor.submit(self._faults.after_stage, "decode",
                                        (images_encoding(item.images),))
                  for item in items]
        await asyncio.gather(*(asyncio.wrap_future(delay) for delay in delays))

    def keys(self, items: Sequence[IntakeItem]) -> list[list[SegmentKey | None]]:
        """Per item and image, the cache key the engine will ask for; ``None`` where it will not ask the cache."""
        return [[self._catalog.image_key(content) if item.use_cache and self._is_image_cache_on else None
                 for content in item.images] for item in items]  # raw pixels keyed as one process does

    async def decode(self, items: Sequence[IntakeItem], peek: Peek,
                     keys: Sequence[Sequence[SegmentKey | None]] | None = None) -> list[list[np.ndarray | None]]:
        """Decode every image the engine does not hold; the model's input per item and image (``None``: held).

        ``keys``: what ``keys(items)`` gives, where the caller computed them already.
        """
        flat = [key for item_keys in (self.keys(items) if keys is None else keys) for key in item_keys]
        cached = iter(await peek(flat) if any(key is not None for key in flat) else [False] * len(flat))
        work = []
        pixels: list[list[np.ndarray | None]] = []
        for item_index, item in enumerate(items):
            item_pixels: list[np.ndarray | None] = []
            for image_index, content in enumerate(item.images):
                item_pixels.append(None)
                if not next(cached):
                    work.append((item_index, item, image_index, content))
            pixels.append(item_pixels)
        if work and self._faults is None and decodes_inline([image_pixels(job[3]) for job in work],
                                                            self._inline_image_max_pixels):
            for job in work:  # together small enough that a hop to the pool costs more (router.inline_decode)
                pixels[job[0]][job[2]] = self._decode(*job)
        elif work:
            jobs: list[Future] = []
            try:
                for job in work:
                    jobs.append(self._executor.submit(self._decode, *job))
                outcomes = await asyncio.gather(*map(asyncio.wrap_future, jobs), return_exceptions=True)
            except BaseException:  # cancelled (the client left), or the pool refused a job: drop what waits
                for job in jobs:
                    job.cancel()
                raise
            for job, outcome in zip(work, outcomes):
                if isinstance(outcome, BaseException):
                    raise outcome
                pixels[job[0]][job[2]] = outcome
        return pixels

    def _decode(self, item_index: int, item: IntakeItem, image_index: int, content: ImageContent) -> np.ndarray:
        """One image -> the model's input (a decode-pool thread, or the loop); errors as the intake names them."""
        try:
            if content.pixels is not None:
                pixels = np.frombuffer(content.pixels, dtype=np.uint8).reshape(content.shape)  # (H, W, 3)
                return pixels_to_model_input(pixels, self._preprocess)  # (S, S, 3)
            decoded = self._decode_image(content.encoded)
            return (pixels_to_model_input(decoded, self._preprocess) if isinstance(decoded, np.ndarray)
                    else resize_to_model_input(decoded, self._preprocess))  # (S, S, 3)
        except Exception as e:
            error: Exception = ImageItemError(image_index, e) if item.images_as_list else e
            raise IntakeItemError(item_index, error) from e
