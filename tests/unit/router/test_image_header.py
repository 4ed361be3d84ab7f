"""Encoding and size from an image's first bytes, checked against what Pillow reads; the drill's encoding filter."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from encoded_images import encode, encoded_image, noise_image
from router.faults import FaultInjector, FaultPlan
from router.image_header import (
    encoding_of_bytes,
    image_pixels,
    image_size_px,
    images_encoding,
    largest_image_pixels,
)
from router.segments import ImageContent

SIZES_PX = [(1, 1), (40, 30), (30, 40), (3840, 3), (3, 2160)]  # wide and tall: sizes past one byte


@pytest.mark.parametrize("size_px", SIZES_PX)
@pytest.mark.parametrize(("fmt", "options", "encoding"), [
    ("PNG", {}, "png"),
    ("JPEG", {}, "jpeg"),
    ("JPEG", {"progressive": True}, "jpeg"),
    ("JPEG", {"exif": b"Exif\x00\x00" + bytes(2000)}, "jpeg"),  # tables and EXIF before the frame header
    ("WEBP", {}, "webp"),
    ("WEBP", {"lossless": True}, "webp"),
    ("GIF", {}, "gif"),
])
def test_size_and_encoding_match_what_pillow_reads(fmt: str, options: dict, encoding: str, size_px) -> None:
    data = encode(noise_image(0, size_px), fmt, **options)
    assert encoding_of_bytes(data) == encoding
    assert image_size_px(data) == Image.open(io.BytesIO(data)).size == size_px


def test_extended_webp_with_alpha() -> None:
    data = encode(Image.new("RGBA", (300, 200), (1, 2, 3, 4)), "WEBP")
    assert data[12:16] == b"VP8X"
    assert image_size_px(data) == (300, 200)


@pytest.mark.parametrize("data", [
    b"", b"\x89PNG\r\n\x1a\n\x00\x00", b"\xff\xd8\xff", b"\xff\xd8\xff" + b"\xff" * 100_000,
    b"RIFF\x00\x00\x00\x00WEBPVP8 ", b"GIF89a\x01", encode(noise_image(0), "BMP"), encode(noise_image(0), "TIFF"),
])
def test_unreadable_or_unknown_headers_have_no_size(data: bytes) -> None:
    assert image_size_px(data) is None


def test_a_requests_encoding_and_largest_image() -> None:
    png = ImageContent(encoded=encoded_image(1, (40, 30), "PNG"))
    big_png = ImageContent(encoded=encoded_image(2, (400, 300), "PNG"))
    jpeg = ImageContent(encoded=encoded_image(3, (50, 50), "JPEG"))
    raw = ImageContent(pixels=bytes(20 * 10 * 3), shape=(10, 20, 3))
    bmp = ImageContent(encoded=encode(noise_image(0), "BMP"))
    assert images_encoding([]) is None
    assert images_encoding([png, big_png]) == "png"
    assert images_encoding([png, jpeg]) == "mixed"
    assert images_encoding([raw]) == "raw_uint8"
    assert images_encoding([bmp]) == "other"
    assert image_pixels(raw) == 200
    assert largest_image_pixels([png, big_png, jpeg]) == 120_000
    assert largest_image_pixels([png, bmp]) is None  # one size unknown: the largest is unknown
    assert largest_image_pixels([]) is None


def test_a_decode_drill_kept_to_one_encoding_delays_only_those_requests() -> None:
    slept: list[float] = []
    injector = FaultInjector(clock_s=lambda: 0.0, sleep_s=slept.append, seed=0)
    injector.activate(FaultPlan(stage="decode", delay_ms=50, fraction=1.0, duration_s=10, only_encoding="png"))
    for encoding in ("png", "jpeg", None, "mixed", "png"):
        injector.after_stage("decode", (encoding,))
    assert slept == [0.05, 0.05]


def test_a_compute_drill_kept_to_one_encoding_delays_only_batches_holding_it() -> None:
    slept: list[float] = []
    injector = FaultInjector(clock_s=lambda: 0.0, sleep_s=slept.append, seed=0)
    injector.activate(FaultPlan(stage="vision", delay_ms=172, fraction=1.0, duration_s=10, only_encoding="png"))
    for encodings in ({"jpeg"}, {"jpeg", "png"}, set(), {None}, {"png"}):
        injector.after_stage("vision", encodings)
    injector.after_stage("text", {"png"})  # another stage's plan
    assert slept == [0.172, 0.172]


@pytest.mark.parametrize("stage", ["decode", "vision"])
def test_an_encoding_filter_takes_known_encodings_only(stage: str) -> None:
    with pytest.raises(ValueError):
        FaultPlan(stage=stage, delay_ms=1, fraction=1.0, duration_s=1, only_encoding="bmp")


def test_one_vocabulary_for_drills_spans_and_drift_attribution() -> None:
    """Every label the sniffer gives is a value of the monitor's ``image_encoding``, which adds only ``none``."""
    from monitoring.inputs import DIMENSIONS, IMAGE_ENCODING
    from router.image_header import ENCODINGS

    attribution_values = dict(DIMENSIONS)[IMAGE_ENCODING]
    assert set(attribution_values) == {"none", *ENCODINGS}
    bmp, tiff = encode(noise_image(0), "BMP"), encode(noise_image(0), "TIFF")
    assert encoding_of_bytes(bmp) == encoding_of_bytes(tiff) == "other" and "other" in attribution_values
