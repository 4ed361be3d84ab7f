"""What raw ``uint8`` pixels an API process decoded into shared memory send on to the engine: key and length.

A raw upload is as large as its pixels (2.4 MB for 1024x768). Once the API
process has written the model's input into a slot, the engine needs only what
the bytes give: the cache key (hashed here, with the engine's fingerprint) and
the facts (shape, length), so the bytes stay here (``ImageContent.left_behind``).
An image with no slot (the peek said the engine's cache holds it) keeps its
bytes: if it left the cache since, the engine decodes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from router.intake import IntakeItem
from router.segments import ImageContent, SegmentCatalog


def raw_pixels_left_behind(items: list[IntakeItem], slots: Sequence[Sequence[object | None]],
                           catalog: SegmentCatalog) -> list[IntakeItem]:
    """The items as the engine gets them: raw pixels decoded into a slot go as their key and length.

    ``slots``: per item and image, what goes to a slot (its number, or the
    decoded pixels about to be put there), ``None`` for an image not decoded.
    """
    sent = items
    for index, (item, item_slots) in enumerate(zip(items, slots)):
        images = images_left_behind(item.images, item_slots, catalog)
        if images is not item.images:
            if sent is items:
                sent = list(items)
            sent[index] = dataclasses.replace(item, images=images)
    return sent


def images_left_behind(images: tuple[ImageContent, ...], slots: Sequence[object | None],
                       catalog: SegmentCatalog) -> tuple[ImageContent, ...]:
    """``images`` with each raw one that has a slot as its key and length; the same tuple when there is none."""
    if not any(slot is not None and content.pixels for content, slot in zip(images, slots)):
        return images
    return tuple(content.left_behind(catalog.image_key(content)) if slot is not None and content.pixels else content
                 for content, slot in zip(images, slots))
