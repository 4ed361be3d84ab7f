"""Which images are decoded on the event loop: every size readable from its header, their sum within the limit."""

from __future__ import annotations

import numpy as np

from encoded_images import encoded_image
from router.image_header import image_pixels
from router.inline_decode import INLINE_IMAGE_MAX_PIXELS, decodes_inline
from router.segments import ImageContent


def _sizes(*images: ImageContent) -> list[int | None]:
    return [image_pixels(image) for image in images]  # what the callers hand the rule: sizes from headers


def test_small_images_together_within_the_limit_decode_inline():
    png = ImageContent(encoded=encoded_image(1, (40, 30), "PNG"))  # 1,200 pixels
    jpeg = ImageContent(encoded=encoded_image(2, (20, 10), "JPEG"))  # 200 pixels
    assert decodes_inline(_sizes(png), 1_200) and not decodes_inline(_sizes(png), 1_199)
    assert decodes_inline(_sizes(png, jpeg), 1_400) and not decodes_inline(_sizes(png, jpeg), 1_399)  # together
    assert not decodes_inline(_sizes(png), 0)  # 0: always the pool


def test_raw_pixels_count_by_their_shape_and_an_unreadable_header_or_no_image_goes_to_the_pool():
    raw = ImageContent(pixels=np.zeros((30, 40, 3), np.uint8).tobytes(), shape=(30, 40, 3))
    assert decodes_inline(_sizes(raw), 1_200) and not decodes_inline(_sizes(raw), 1_199)
    unreadable = ImageContent(encoded=b"not an image header")
    assert not decodes_inline(_sizes(unreadable), 10**9)
    assert not decodes_inline(_sizes(raw, unreadable), 10**9)
    assert not decodes_inline([], 10**9)


def test_the_default_takes_a_224_pixel_image_and_not_a_photograph():
    assert decodes_inline(_sizes(ImageContent(encoded=encoded_image(3, (224, 224), "JPEG"))), INLINE_IMAGE_MAX_PIXELS)
    assert not decodes_inline(_sizes(ImageContent(encoded=encoded_image(4, (640, 480), "JPEG"))),
                              INLINE_IMAGE_MAX_PIXELS)
