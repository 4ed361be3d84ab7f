"""Any Pillow image -> 8-bit RGB, the one way serving and training both see it.

The server decodes request bytes with this (``server.ingest.decoding``) and
``mmserve train-fusion`` decodes its image files with it, so a head is
trained on the pixels serving computes: images with transparency are
composited on white (what a viewer shows), 16-bit and float grey images are
scaled rather than clipped, every other mode is converted by Pillow.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "La", "RGBa"})
_WIDE_INTEGER_MODES = frozenset({"I;16", "I;16B", "I;16L", "I;16N", "I"})


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` in mode RGB (itself when it already is)."""
    if image.mode == "RGB":
        return image
    if image.mode in _WIDE_INTEGER_MODES:
        # 16-bit (or 32-bit holding 16-bit) grey: scale 0..65535 to 0..255.
        wide = np.asarray(image, dtype=np.float64)
        grey = np.clip(np.rint(wide / 257.0), 0, 255).astype(np.uint8)
        return Image.fromarray(grey).convert("RGB")
    if image.mode == "F":
        grey = np.clip(np.rint(np.asarray(image, dtype=np.float64)), 0, 255).astype(np.uint8)
        return Image.fromarray(grey).convert("RGB")
    has_alpha = image.mode in _ALPHA_MODES or (image.mode == "P" and "transparency" in image.info)
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
