"""Images made here: photo-like JPEGs, and noise images where a benchmark wants the decode to weigh.

No photograph can be downloaded where benchmarks run; the photo-like ones
(smooth gradients, texture and sensor-like noise, quality 90) give the DCT
coefficients and file sizes of a camera photo at the same quality. They are
not photographs, and a benchmark that uses them says so.
"""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

JPEG_QUALITY = 90


def photo_like_pixels(width: int, height: int, seed: int = 0) -> np.ndarray:
    """(height, width, 3) uint8: gradients + texture + a few edges + noise, deterministic for ``seed``."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    u, v = x / max(width - 1, 1), y / max(height - 1, 1)
    sky = np.stack([70 + 120 * v, 110 + 90 * v, 200 - 60 * v], -1)  # (H, W, 3) a vertical gradient
    ground = np.stack([90 + 60 * u, 120 - 40 * v, 60 + 30 * u], -1)
    horizon = height * (0.55 + 0.05 * np.sin(x / width * 6.0 + seed))  # (H, W) a wavy edge
    base = np.where((y > horizon)[..., None], ground, sky)
    period = max(width, height) / 80.0  # texture at a photo's scale, whatever the size
    texture = 18 * np.sin(x / period + 3 * np.sin(y / (2.7 * period)))[..., None] * (y > horizon)[..., None]
    noise = rng.normal(0, 5, (height, width, 3))
    return np.clip(base + texture + noise, 0, 255).astype(np.uint8)  # (H, W, 3)


def photo_like_jpeg(width: int, height: int, seed: int = 0, quality: int = JPEG_QUALITY) -> bytes:
    """The JPEG file bytes of ``photo_like_pixels`` (4:2:0, as cameras and Pillow's default write)."""
    buffer = io.BytesIO()
    Image.fromarray(photo_like_pixels(width, height, seed)).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def noise_image(width: int, height: int, seed: int = 0, image_format: str = "JPEG",
                quality: int = JPEG_QUALITY) -> bytes:
    """Uniform random pixels, encoded: the costliest decode per pixel (``quality`` is JPEG's)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)  # (H, W, 3)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=image_format, quality=quality)
    return buffer.getvalue()


def data_uri(jpeg: bytes) -> str:
    """``data:image/jpeg;base64,...``: an image as the OpenAI embeddings API takes it."""
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")
