"""A pool of distinct, deterministic, already-encoded images.

Images are generated in-process (no files, no downloads) from ``(seed, key)``,
so the same seed always sends the same bytes for the same key: a repeated key
is a repeated image, which is what exercises the server's content-addressed
cache. Each image is a smooth random colour field with a little noise, so the
encoded size is closer to a photo's than pure noise (incompressible) or a flat
colour (a few hundred bytes) would be.

Everything is encoded and base64'd before the run starts; the sender only
concatenates bytes.
"""

from __future__ import annotations

import base64
import enum
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from PIL import Image

from benchmarks.loadgen.errors import ConfigError

_SIZE_PATTERN = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")
_COARSE_GRID_PX = 8
_NOISE_AMPLITUDE = 6
_JPEG_QUALITY = 90
_MAX_SIDE_PX = 16384


class ImageFormat(str, enum.Enum):
    """Encodings the server accepts in ``image.b64``."""

    PNG = "png"
    JPEG = "jpeg"


@dataclass(frozen=True)
class ImageSize:
    width_px: int
    height_px: int

    def __str__(self) -> str:
        return f"{self.width_px}x{self.height_px}"


def parse_image_size(text: str) -> ImageSize:
    """Parse ``WxH`` (e.g. ``224x224``) into an ``ImageSize``."""
    match = _SIZE_PATTERN.match(text)
    if match is None:
        raise ConfigError(f"image size {text!r} is not WxH, e.g. 224x224")
    width_px, height_px = int(match.group(1)), int(match.group(2))
    if not (1 <= width_px <= _MAX_SIDE_PX and 1 <= height_px <= _MAX_SIDE_PX):
        raise ConfigError(f"image size {text!r} must be between 1 and {_MAX_SIDE_PX} px per side")
    return ImageSize(width_px, height_px)


def render_image(seed: int, key: int, size: ImageSize) -> np.ndarray:
    """The pixels for ``key``: uint8 (H, W, 3), a pure function of its arguments."""
    rng = np.random.default_rng([seed & 0xFFFFFFFF, key & 0xFFFFFFFFFFFFFFFF])
    coarse = rng.integers(0, 256, size=(_COARSE_GRID_PX, _COARSE_GRID_PX, 3), dtype=np.uint8)  # (8, 8, 3)
    smooth = Image.fromarray(coarse).resize((size.width_px, size.height_px), Image.Resampling.BILINEAR)
    pixels = np.asarray(smooth, dtype=np.int16)  # (H, W, 3)
    noise = rng.integers(-_NOISE_AMPLITUDE, _NOISE_AMPLITUDE + 1, size=pixels.shape, dtype=np.int16)
    image: np.ndarray = np.clip(pixels + noise, 0, 255).astype(np.uint8)  # (H, W, 3)
    return image


def encode_image(pixels: np.ndarray, image_format: ImageFormat) -> bytes:
    """Encode uint8 (H, W, 3) pixels as PNG or JPEG bytes."""
    buffer = io.BytesIO()
    image = Image.fromarray(pixels)
    if image_format is ImageFormat.JPEG:
        image.save(buffer, format="JPEG", quality=_JPEG_QUALITY)
    else:
        image.save(buffer, format="PNG")
    return buffer.getvalue()


class ImagePool:
    """Encoded images by key, rendered once in ``prepare`` and reused for the whole run."""

    def __init__(self, seed: int, size: ImageSize, image_format: ImageFormat) -> None:
        self.seed = seed
        self.size = size
        self.image_format = image_format
        self._b64_by_key: dict[int, bytes] = {}

    def prepare(self, keys: Iterable[int]) -> None:
        """Render and encode every key not yet in the pool (do this before the clock starts)."""
        for key in keys:
            if key not in self._b64_by_key:
                encoded = encode_image(render_image(self.seed, key, self.size), self.image_format)
                self._b64_by_key[key] = base64.b64encode(encoded)

    def b64(self, key: int) -> bytes:
        """The base64 of the encoded image for ``key`` (rendered on demand if not prepared)."""
        encoded = self._b64_by_key.get(key)
        if encoded is None:
            self.prepare((key,))
            encoded = self._b64_by_key[key]
        return encoded

    def __len__(self) -> int:
        return len(self._b64_by_key)

    @property
    def mean_encoded_size_bytes(self) -> float:
        """Mean size of the encoded images (before base64), for the report."""
        if not self._b64_by_key:
            return 0.0
        total_b64 = sum(len(value) for value in self._b64_by_key.values())
        return total_b64 * 3 / 4 / len(self._b64_by_key)
