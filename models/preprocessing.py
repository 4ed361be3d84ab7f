"""Host-side image geometry: resize and centre-crop to the model's input size.

This is the one place where an image's geometry becomes model input, and it
follows the model's ``PreprocessConfig`` (timm's eval transform: resize the
shorter side to ``resize_size``, centre-crop ``input_size``). Normalisation is
not done here: images stay uint8 through batching and the host-to-device copy,
and the vision encoder normalises on the device (``kernels.preprocess_uint8``).

The crop is computed in source coordinates and handed to Pillow's
``resize(box=...)``, so an extreme aspect ratio (1 x 10000) never materialises
a huge intermediate image.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from models.config import PreprocessConfig

_RESAMPLE = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
}


def crop_box(width: int, height: int, config: PreprocessConfig) -> tuple[float, float, float, float]:
    """The source-image box that ends up as the centre crop, as (left, top, right, bottom)."""
    short_side = min(width, height)
    scale = config.resize_size / short_side
    # Size after the shorter-side resize, as torchvision computes it.
    if width <= height:
        resized_w, resized_h = config.resize_size, int(config.resize_size * height / width)
    else:
        resized_w, resized_h = int(config.resize_size * width / height), config.resize_size
    left = int(round((resized_w - config.input_size) / 2.0))
    top = int(round((resized_h - config.input_size) / 2.0))
    return (
        left / scale,
        top / scale,
        (left + config.input_size) / scale,
        (top + config.input_size) / scale,
    )


def resize_to_model_input(image: Image.Image, config: PreprocessConfig) -> np.ndarray:
    """An RGB Pillow image -> the model's (S, S, 3) uint8 input, S = ``input_size``."""
    if image.mode != "RGB":
        raise ValueError(f"expected an RGB image, got mode {image.mode!r}")
    box = crop_box(image.width, image.height, config)
    size = (config.input_size, config.input_size)
    resized = image.resize(size, resample=_RESAMPLE[config.interpolation], box=box)
    return np.array(resized, dtype=np.uint8)  # (S, S, 3), writable


def pixels_to_model_input(pixels: np.ndarray, config: PreprocessConfig) -> np.ndarray:
    """Raw (H, W, 3) uint8 pixels -> the model's (S, S, 3) uint8 input."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected (H, W, 3) uint8 pixels, got {pixels.dtype} {pixels.shape}")
    return resize_to_model_input(Image.fromarray(pixels), config)
