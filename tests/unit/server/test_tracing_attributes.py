"""Span attributes name facts, never content: the image encoding comes from the file's first bytes."""

from __future__ import annotations

import pytest

from encoded_images import encoded_image
from router.segments import ImageContent
from server.http.trace_attributes import image_encoding
from server.ingest.inputs import ParsedInput
from server.http.trace_attributes import item_attributes


@pytest.mark.parametrize(("fmt", "name"), [("PNG", "png"), ("JPEG", "jpeg"), ("WEBP", "webp"), ("GIF", "gif"),
                                           ("BMP", "bmp"), ("TIFF", "tiff")])
def test_the_encoding_is_read_from_the_magic_bytes(fmt, name):
    assert image_encoding(ImageContent(encoded=encoded_image(1, (8, 8), fmt))) == name


def test_raw_pixels_and_unknown_bytes():
    assert image_encoding(ImageContent(pixels=b"\0" * 12, shape=(2, 2, 3))) == "uint8"
    assert image_encoding(ImageContent(encoded=b"not an image")) == "unknown"


def test_an_unanswered_item_shows_what_it_sent_and_no_text():
    text = "the text itself"
    parsed = ParsedInput(text, (ImageContent(pixels=b"\0" * 12, shape=(2, 2, 3)),), "low", None, False)
    attributes = item_attributes(parsed, None, {"fusion": 30_000})
    assert attributes["mmserve.deadline_ms"] == 30_000 and attributes["mmserve.priority"] == "low"
    assert attributes["mmserve.image.bytes"] == (12,) and attributes["mmserve.image.raw_shapes"] == ("2x2x3",)
    assert text not in repr(attributes)
