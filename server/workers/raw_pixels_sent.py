"""What an image an API process decoded into shared memory sends on to the engine: its key, length and header.

A raw upload is as large as its pixels (2.4 MB for 1024x768), and an encoded
one as its file (12 KB for a 224-px JPEG). Once the API process has written
the model's input into a slot, the engine needs only what the bytes give:
the cache key and the facts (raw pixels: shape and length; an encoded image:
length, and encoding and W x H from its header), so the bytes stay here
(``ImageContent.left_behind``, ``encoded_left_behind``). The engine, the one
process every request passes, then reads, decodes and keys a call of a few
hundred bytes, not the files again. An image with no slot (the peek said the
engine's cache holds it) keeps its bytes: if it left the cache since, the
engine decodes it.

Keys: raw pixels are hashed here (``catalog.image_key``). An encoded image
goes with the key its peek computed (``keys``), ``None`` where the engine will
not ask the cache (its image cache off, or ``use_cache`` false), so nothing is
hashed for nothing; without ``keys`` (a caller that computed none) encoded
images keep their bytes.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence

from router.image_header import image_encoding, image_pixels
from router.intake import IntakeItem
from router.segments import ImageContent, SegmentCatalog, SegmentKey


def raw_pixels_left_behind(items: list[IntakeItem], slots: Sequence[Sequence[object | None]],
                           catalog: SegmentCatalog,
                           keys: Sequence[Sequence[SegmentKey | None]] | None = None) -> list[IntakeItem]:
    """The items as the engine gets them: images decoded into a slot go as their key, length and header.

    ``slots``: per item and image, what goes to a slot (its number, or the
    decoded pixels about to be put there), ``None`` for an image not decoded;
    ``keys``: per item and image, the cache key the peek computed (the module's docstring).
    """
    sent = items
    for index, (item, item_slots) in enumerate(zip(items, slots)):
        images = images_left_behind(item.images, item_slots, catalog, None if keys is None else keys[index])
        if images is not item.images:
            if sent is items:
                sent = list(items)
            sent[index] = dataclasses.replace(item, images=images)
    return sent


def images_left_behind(images: tuple[ImageContent, ...], slots: Sequence[object | None], catalog: SegmentCatalog,
                       keys: Sequence[SegmentKey | None] | None = None) -> tuple[ImageContent, ...]:
    """``images`` with each one that has a slot left behind; the same tuple when none is (the module's docstring)."""
    behind = tuple(_left_behind(content, catalog, keys, index) if slot is not None else content
                   for index, (content, slot) in enumerate(zip(images, slots)))
    return images if all(map(operator.is_, behind, images)) else behind


def _left_behind(content: ImageContent, catalog: SegmentCatalog, keys: Sequence[SegmentKey | None] | None,
                 index: int) -> ImageContent:
    if content.pixels:
        return content.left_behind(catalog.image_key(content))
    if keys is not None and content.encoded:
        return content.encoded_left_behind(keys[index], image_encoding(content), image_pixels(content))
    return content
