"""Every Pillow mode becomes RGB; bad bytes get named 4xx errors; EXIF orientation applies."""

from __future__ import annotations

import struct
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

import encoded_images

from server.ingest.decoding import (decode_base64, decode_image, decode_pixels,
                                    ignore_decompression_bomb_warnings)
from server.errors import ApiError

MAX_PIXELS = 10_000_000


def encode(image: Image.Image, fmt: str = "PNG", **kwargs) -> bytes:
    return encoded_images.encode(image, fmt, **kwargs)


def gradient(mode: str, size=(16, 12)) -> Image.Image:
    x = np.linspace(0, 255, size[0] * size[1]).reshape(size[1], size[0]).astype(np.uint8)
    return Image.fromarray(np.stack([x, x[::-1], np.full_like(x, 90)], -1)).convert(mode)


@pytest.mark.parametrize(("mode", "fmt"), [
    ("RGB", "PNG"), ("L", "PNG"), ("LA", "PNG"), ("RGBA", "PNG"), ("P", "PNG"), ("1", "PNG"),
    ("CMYK", "JPEG"), ("CMYK", "TIFF"), ("RGB", "JPEG"), ("RGB", "WEBP"), ("RGB", "BMP"), ("P", "GIF"),
])
def test_every_mode_becomes_rgb(mode: str, fmt: str):
    decoded = decode_image(encode(gradient(mode), fmt), MAX_PIXELS)
    assert decoded.mode == "RGB" and decoded.size == (16, 12)


def test_transparent_pixels_are_composited_on_white():
    rgba = Image.new("RGBA", (4, 4), (10, 20, 30, 0))
    assert decode_image(encode(rgba), MAX_PIXELS).getpixel((0, 0)) == (255, 255, 255)
    palette = Image.new("P", (4, 4), 0)
    palette.putpalette([0, 0, 0] * 256)
    palette.info["transparency"] = 0
    assert decode_image(encode(palette, transparency=0), MAX_PIXELS).getpixel((1, 1)) == (255, 255, 255)


def test_sixteen_bit_grey_is_scaled_not_clipped():
    wide = Image.fromarray(np.full((4, 4), 32768, dtype=np.uint16))
    assert wide.mode.startswith("I;16")
    decoded = decode_image(encode(wide), MAX_PIXELS)
    assert decoded.getpixel((0, 0)) == (128, 128, 128)


def test_exif_orientation_is_applied():
    image = Image.new("RGB", (20, 10), (0, 0, 0))
    image.paste((255, 0, 0), (0, 0, 10, 10))  # left half red
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    decoded = decode_image(encode(image, "JPEG", exif=exif.tobytes(), quality=95), MAX_PIXELS)
    assert decoded.size == (10, 20)
    red, green, _ = decoded.getpixel((5, 2))
    assert red > 200 and green < 60  # the red half is now on top


def test_animated_images_give_the_first_frame():
    frames = [Image.new("RGB", (8, 8), color) for color in ((255, 0, 0), (0, 0, 255))]
    animated = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert decode_image(animated, MAX_PIXELS).getpixel((0, 0))[0] > 200


@pytest.mark.parametrize(("data", "status", "code"), [
    (b"", 400, "empty_image"),
    (b"definitely not an image", 415, "unsupported_image_format"),
])
def test_bad_bytes_are_named(data: bytes, status: int, code: str):
    with pytest.raises(ApiError) as raised:
        decode_image(data, MAX_PIXELS)
    assert (raised.value.status, raised.value.code, raised.value.field) == (status, code, "image")


def test_truncated_images_are_corrupt():
    data = encode(gradient("RGB", (64, 64)), "JPEG")
    with pytest.raises(ApiError) as raised:
        decode_image(data[: len(data) // 2], MAX_PIXELS)
    assert (raised.value.status, raised.value.code) == (400, "corrupt_image")


def test_pixel_limit_comes_from_the_header():
    data = encode(gradient("RGB", (100, 100)))
    with pytest.raises(ApiError) as raised:
        decode_image(data, max_pixels=9_999)
    assert raised.value.status == 413 and "9999" in raised.value.message


def png_header_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` RGB pixels (its data is a few bytes)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


def test_a_header_past_pillows_bomb_warning_is_refused_by_our_limit_from_threads_without_a_warning():
    """Decode threads never swap the process's warning filters (``catch_warnings`` is not thread-safe:
    interleaved, one thread puts back a list another made), and Pillow's warning for a header over its
    ``MAX_IMAGE_PIXELS`` stays quiet: our limit answers it."""
    ignore_decompression_bomb_warnings()  # as importing the module did; pytest's collection keeps no filters
    side = int((Image.MAX_IMAGE_PIXELS * 1.2) ** 0.5)  # over Pillow's warning, under its error (twice the limit)
    data = png_header_claiming(side, side)

    def refusal(_: int) -> tuple[int, str]:
        try:
            decode_image(data, MAX_PIXELS)
        except ApiError as e:
            return e.status, e.code
        return 200, "decoded"

    with warnings.catch_warnings(record=True) as caught:
        filters, kept = warnings.filters, list(warnings.filters)
        with ThreadPoolExecutor(4) as pool:
            assert set(pool.map(refusal, range(200))) == {(413, "image_too_large")}
        assert warnings.filters is filters and warnings.filters == kept
    assert [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)] == []


def test_base64_and_raw_pixels():
    with pytest.raises(ApiError, match="not valid base64"):
        decode_base64("abc", "image.b64")
    with pytest.raises(ApiError) as raised:
        decode_base64("", "image.b64")
    assert raised.value.code == "empty_image"
    pixels = decode_pixels([2, 3, 3], bytes(range(18)), MAX_PIXELS)
    assert pixels.shape == (2, 3, 3) and pixels[1, 2, 2] == 17
    with pytest.raises(ApiError) as raised:
        decode_pixels([0, 3, 3], b"", MAX_PIXELS)
    assert raised.value.code == "invalid_image_size"
    with pytest.raises(ApiError) as raised:
        decode_pixels([5000, 5000, 3], b"", 1000)
    assert raised.value.status == 413
