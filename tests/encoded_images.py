"""Seeded noise images, encoded: the one way a test makes an image to send to a server.

    noise_image(seed, size_px)              a Pillow RGB image of uniform noise, size (W, H)
    gradient_image(size_px, shift)          smooth colour ramps: compresses like a photo, so a lossy
                                            codec's error stays small (JPEG decode comparisons)
    encode(image, fmt, **save_options)      its file bytes (PNG, JPEG, ...)
    encoded_image(seed, size_px, fmt)       both in one step
    encoded_image_b64(seed, size_px, fmt)   the same as base64 text, for a JSON body
    b64(data)                               any bytes as base64 text

A test that needs a picture of its own (a colour, a shape, a mode, EXIF)
builds the Pillow image and calls ``encode``: encoding happens here only, so a
test of a malformed file is the one place that writes bytes by hand.

The same seed and size give the same bytes in every test, so tests that
compare servers, backends or protocols send the very same image. A plain
module rather than a fixture because bodies are also built at import time
(parametrize lists); ``tests/conftest.py`` puts ``tests/`` on the path, so
any test imports it as ``encoded_images``.
"""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

DEFAULT_SIZE_PX = (40, 30)  # (W, H)


def noise_image(seed: int, size_px: tuple[int, int] = DEFAULT_SIZE_PX) -> Image.Image:
    width, height = size_px
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)  # (H, W, 3)
    return Image.fromarray(pixels)


def gradient_image(size_px: tuple[int, int] = DEFAULT_SIZE_PX, shift: int = 0) -> Image.Image:
    width, height = size_px
    y, x = np.mgrid[0:height, 0:width]  # (H, W) each
    pixels = np.stack([(x * 255 // width + shift) % 256, y * 255 // height, (x + y) * 127 // (width + height)], -1)
    return Image.fromarray(pixels.astype(np.uint8))  # (H, W, 3)


def encode(image: Image.Image, fmt: str, **save_options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save_options)
    return buffer.getvalue()


def encoded_image(seed: int, size_px: tuple[int, int] = DEFAULT_SIZE_PX, fmt: str = "PNG",
                  **save_options: object) -> bytes:
    return encode(noise_image(seed, size_px), fmt, **save_options)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def encoded_image_b64(seed: int, size_px: tuple[int, int] = DEFAULT_SIZE_PX, fmt: str = "PNG",
                      **save_options: object) -> str:
    return b64(encoded_image(seed, size_px, fmt, **save_options))
