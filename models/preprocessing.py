"""Host-side image geometry: resize and centre-crop to the model's input size.

This is the one place where an image's geometry becomes model input, and it
follows the model's ``PreprocessConfig.resize_mode``. Normalisation is not
done here: images stay uint8 through batching and the host-to-device copy,
and the vision encoder normalises on the device (``kernels.preprocess_uint8``).

``crop_box`` (the presets) computes the crop in source coordinates and hands
it to Pillow's ``resize(box=...)``, so an extreme aspect ratio (1 x 10000)
never materialises a huge intermediate image.

``shortest_edge`` and ``squash`` (pretrained models) do what the reference
libraries do, step for step: Pillow resizes the whole image (the size computed
as torchvision and Hugging Face compute it), then the centre crop is sliced
out. The uint8 result is then byte-identical to theirs, so pixel values and
embeddings match the reference within float rounding. Where the whole-image
resize would exceed ``MAX_EXACT_RESIZE_PIXELS`` (a 1 x 10000 strip) the crop
is read from the source box instead, as ``crop_box`` does.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from models.loading.config import PreprocessConfig

_RESAMPLE = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
}


def crop_box(width: int, height: int, config: PreprocessConfig) -> tuple[float, float, float, float]:
    """The source-image box that ends up as the centre crop, as (left, top, right, bottom)."""
    short_side = min(width, height)
    scale = config.resize_size / short_side
    resized_w, resized_h = shortest_edge_size(width, height, config.resize_size)
    left = centre_offset(resized_w, config.input_size, config.crop_rounding)
    top = centre_offset(resized_h, config.input_size, config.crop_rounding)
    return (
        left / scale,
        top / scale,
        (left + config.input_size) / scale,
        (top + config.input_size) / scale,
    )


# A whole-image resize larger than this (a strip of extreme aspect ratio) is
# done from the crop's source box instead: 64 MP of RGB is 192 MB.
MAX_EXACT_RESIZE_PIXELS = 64_000_000


def shortest_edge_size(width: int, height: int, shortest_edge: int) -> tuple[int, int]:
    """(width, height) after resizing the shorter side to ``shortest_edge``, as torchvision and HF compute it."""
    if width <= height:
        return shortest_edge, int(shortest_edge * height / width)
    return int(shortest_edge * width / height), shortest_edge


def centre_offset(resized: int, crop: int, rounding: str) -> int:
    if rounding == "floor":  # Hugging Face's center_crop
        return (resized - crop) // 2
    return int(round((resized - crop) / 2.0))  # torchvision's CenterCrop (timm)


def _resize_box(image: Image.Image, config: PreprocessConfig) -> np.ndarray:
    box = crop_box(image.width, image.height, config)
    size = (config.input_size, config.input_size)
    resized = image.resize(size, resample=_RESAMPLE[config.interpolation], box=box)
    return np.array(resized, dtype=np.uint8)  # (S, S, 3), writable


def _resize_then_crop(image: Image.Image, config: PreprocessConfig) -> np.ndarray:
    resized_w, resized_h = shortest_edge_size(image.width, image.height, config.resize_size)
    if resized_w * resized_h > MAX_EXACT_RESIZE_PIXELS:
        return _resize_box(image, config)
    resized = np.asarray(image.resize((resized_w, resized_h), resample=_RESAMPLE[config.interpolation]))
    top = centre_offset(resized_h, config.input_size, config.crop_rounding)
    left = centre_offset(resized_w, config.input_size, config.crop_rounding)
    crop = resized[top: top + config.input_size, left: left + config.input_size]  # (S, S, 3)
    # A copy, always: when nothing is cropped (resize_size == input_size, open_clip's "shortest") the slice is
    # Pillow's read-only buffer itself, and torch.from_numpy warns on it.
    return np.array(crop, dtype=np.uint8, order="C")


def _squash(image: Image.Image, config: PreprocessConfig) -> np.ndarray:
    size = (config.input_size, config.input_size)
    return np.array(image.resize(size, resample=_RESAMPLE[config.interpolation]), dtype=np.uint8)  # (S, S, 3)


_BY_MODE = {"crop_box": _resize_box, "shortest_edge": _resize_then_crop, "squash": _squash}


def resize_to_model_input(image: Image.Image, config: PreprocessConfig) -> np.ndarray:
    """An RGB Pillow image -> the model's (S, S, 3) uint8 input, S = ``input_size``."""
    if image.mode != "RGB":
        raise ValueError(f"expected an RGB image, got mode {image.mode!r}")
    return _BY_MODE[config.resize_mode](image, config)


def pixels_to_model_input(pixels: np.ndarray, config: PreprocessConfig) -> np.ndarray:
    """Raw (H, W, 3) uint8 pixels -> the model's (S, S, 3) uint8 input."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected (H, W, 3) uint8 pixels, got {pixels.dtype} {pixels.shape}")
    return resize_to_model_input(Image.fromarray(pixels), config)
