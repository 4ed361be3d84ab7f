"""Bytes from a client -> an RGB image the model can take, or a named 4xx.

Runs in the server's decode thread pool, never on the event loop. The pixel
count is checked from the header before any pixel is decoded, so a tiny file
that claims to be 100 000 x 100 000 (a decompression bomb) costs nothing.
EXIF orientation is applied, every Pillow mode becomes 8-bit RGB the way
``models.rgb`` says (the way ``mmserve train-fusion`` reads its images too),
and an animation gives its first frame.

With ``draft_side`` (``--jpeg-draft``) a JPEG is decoded by libjpeg at 1/2,
1/4 or 1/8 scale in the DCT (Pillow's ``Image.draft``): the largest reduction
that still leaves both sides at least ``draft_side`` pixels, the size the
model's resize then needs, so the resize only ever shrinks. A 1024x768 photo
for a 224-pixel model decodes at 512x384 in about half the CPU; the pixels
differ from the exact decode by about one level, so it is off by default (the
default path equals the reference processor). Other formats, and JPEGs too
small to reduce, decode exactly.

Pillow warns (``DecompressionBombWarning``) when a header claims more than
``Image.MAX_IMAGE_PIXELS`` and raises over twice that. mmserve's own limit
(``MMSERVE_MAX_IMAGE_PIXELS``) refuses from the header either way, so the
warning tells nobody anything; it is ignored once for the process
(``ignore_decompression_bomb_warnings``, at import) rather than around each
decode: ``warnings.catch_warnings`` swaps the process-wide filter list, so
decode threads running at once would put back each other's lists (the
warnings module documents it as not thread-safe), and every swap made the
process's other warnings look their filters up again.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from models.rgb import to_rgb
from router.image_header import image_size_px
from server.errors import ApiError


def ignore_decompression_bomb_warnings() -> None:
    """Ignore Pillow's over-``MAX_IMAGE_PIXELS`` warning in this process (module docstring); idempotent."""
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


ignore_decompression_bomb_warnings()


def decode_base64(text: str, field: str) -> bytes:
    """Strict base64 (standard alphabet, padding required); empty is refused."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ApiError(400, "invalid_base64", f"{field} is not valid base64: {e}", field) from e
    if not data:
        raise ApiError(400, "empty_image", f"{field} decodes to zero bytes", field)
    return data


def _check_pixels(width: int, height: int, max_pixels: int, field: str) -> None:
    if width < 1 or height < 1:
        raise ApiError(422, "invalid_image_size", f"{field} is {width}x{height}; both sides must be >= 1", field)
    if width * height > max_pixels:
        raise ApiError(
            413, "image_too_large",
            f"{field} is {width}x{height} = {width * height} pixels; the limit is {max_pixels} "
            "(MMSERVE_MAX_IMAGE_PIXELS)",
            field,
        )


def _over_pillows_limit(data: bytes, pillow_message: str, max_pixels: int, field: str) -> ApiError:
    """The 413 for a header past Pillow's limit, worded as ``_check_pixels`` words ours (Pillow's own
    message names its limit, which is not the one a client can stay under)."""
    size = image_size_px(data)
    if size is not None:
        width, height = size
        described = f"{width}x{height} = {width * height} pixels"
    else:  # a format the header reader does not know (BMP, TIFF): Pillow's count
        counted = re.search(r"\((\d+) pixels\)", pillow_message)
        described = f"{counted.group(1)} pixels" if counted else f"more than {max_pixels} pixels"
    return ApiError(413, "image_too_large",
                    f"{field} is {described}; the limit is {max_pixels} (MMSERVE_MAX_IMAGE_PIXELS)", field)


def draft_scale(width: int, height: int, draft_side: int) -> int:
    """The JPEG DCT reduction (1, 2, 4 or 8) that keeps both sides >= ``draft_side``; 1 = decode exactly.

    The same choice Pillow's ``JpegImageFile.draft`` makes for a requested
    (``draft_side``, ``draft_side``): the reduced side is ``ceil(side / scale)``.
    """
    fits = min(width // draft_side, height // draft_side)
    return next((scale for scale in (8, 4, 2) if fits >= scale), 1)


def decode_image(data: bytes, max_pixels: int, field: str = "image", draft_side: int | None = None) -> Image.Image:
    """Encoded image bytes -> an RGB Pillow image (first frame, EXIF-oriented).

    ``draft_side``: decode a JPEG reduced in the DCT while both sides stay at
    least this many pixels (module docstring); ``None`` decodes exactly.
    """
    if not data:
        raise ApiError(400, "empty_image", f"{field} is empty", field)
    try:
        image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:  # Pillow's own limit, twice MAX_IMAGE_PIXELS: say ours
        raise _over_pillows_limit(data, str(e), max_pixels, field) from e
    except UnidentifiedImageError as e:
        raise ApiError(415, "unsupported_image_format",
                       f"{field} is not an image format this server decodes", field) from e
    except (OSError, SyntaxError, ValueError) as e:
        raise ApiError(400, "corrupt_image", f"{field} cannot be read: {e}", field) from e
    _check_pixels(image.width, image.height, max_pixels, field)
    if draft_side is not None and image.format == "JPEG" and draft_scale(image.width, image.height, draft_side) > 1:
        image.draft(None, (draft_side, draft_side))  # mode unchanged; the size is the reduced one from here
    try:
        image.load()
        ImageOps.exif_transpose(image, in_place=True)  # ours alone: no copy when there is nothing to turn
        return to_rgb(image)
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise ApiError(400, "corrupt_image", f"{field} is truncated or corrupt: {e}", field) from e


def check_pixels_length(shape: list[int], num_bytes: int, max_pixels: int, field: str = "image.uint8") -> None:
    """Raw uint8 pixels: the shape is [H, W, 3], under the pixel limit, and ``num_bytes`` fills it exactly.

    Cheap (no pixel is read), so the server checks it while parsing, before
    the bytes are keyed for the cache or decoded.
    """
    if len(shape) != 3 or shape[2] != 3:
        raise ApiError(422, "invalid_tensor_shape",
                       f"{field}.shape must be [H, W, 3], got {shape}", f"{field}.shape")
    height, width = shape[0], shape[1]
    _check_pixels(width, height, max_pixels, field)
    expected = height * width * 3
    if num_bytes != expected:
        raise ApiError(422, "invalid_tensor_length",
                       f"{field}.b64 holds {num_bytes} bytes; shape {shape} needs {expected}", f"{field}.b64")


def decode_pixels(shape: list[int], data: bytes, max_pixels: int, field: str = "image.uint8") -> np.ndarray:
    """Raw uint8 pixels with a declared [H, W, 3] shape -> an (H, W, 3) array."""
    check_pixels_length(shape, len(data), max_pixels, field)
    return np.frombuffer(data, dtype=np.uint8).reshape(shape[0], shape[1], 3)  # (H, W, 3)
