"""Span attributes name facts, never content; the image encoding is the one sniffer's, in the drift vocabulary."""

from __future__ import annotations

import pytest

from encoded_images import encode, encoded_image, noise_image
from router.item_facts import ItemFacts
from router.segments import ImageContent
from server.http.trace_attributes import item_attributes
from server.http.traced_answer import TracedItem
from server.ingest.inputs import ParsedInput
from server.runtime.monitoring_setup import request_inputs

RAW = ImageContent(pixels=b"\0" * 12, shape=(2, 2, 3))


def _traced(images: tuple[ImageContent, ...], text: str | None = None, priority: str = "normal") -> TracedItem:
    parsed = ParsedInput(text, images, priority, None, False)
    return TracedItem(parsed, ItemFacts.of_images(images, protocol="native", priority=priority))


@pytest.mark.parametrize(("image", "name"), [
    (ImageContent(encoded=encoded_image(1, (8, 8), "PNG")), "png"),
    (ImageContent(encoded=encoded_image(1, (8, 8), "JPEG")), "jpeg"),
    (ImageContent(encoded=encoded_image(1, (8, 8), "WEBP")), "webp"),
    (ImageContent(encoded=encoded_image(1, (8, 8), "GIF")), "gif"),
    (ImageContent(encoded=encode(noise_image(0), "BMP")), "other"),  # decodable, but no label of its own
    (ImageContent(encoded=encode(noise_image(0), "TIFF")), "other"),
    (ImageContent(encoded=b"not an image"), "other"),
    (RAW, "raw_uint8"),
])
def test_a_span_and_drift_attribution_name_one_image_alike(image: ImageContent, name: str):
    traced = _traced((image,))
    assert item_attributes(traced, {"vision": 1_000})["mmserve.image.encodings"] == (name,)
    assert request_inputs(traced.facts).labels()["image_encoding"] == name


def test_several_images_are_named_each_on_the_span_and_mixed_for_drift():
    traced = _traced((ImageContent(encoded=encoded_image(1, (8, 8), "PNG")), RAW))
    assert item_attributes(traced, {"vision": 1_000})["mmserve.image.encodings"] == ("png", "raw_uint8")
    assert request_inputs(traced.facts).labels()["image_encoding"] == "mixed"


def test_an_unanswered_item_shows_what_it_sent_and_no_text():
    text = "the text itself"
    attributes = item_attributes(_traced((RAW,), text, "low"), {"fusion": 30_000})
    assert attributes["mmserve.deadline_ms"] == 30_000 and attributes["mmserve.priority"] == "low"
    assert attributes["mmserve.image.bytes"] == (12,) and attributes["mmserve.image.raw_shapes"] == ("2x2x3",)
    assert "mmserve.text.tokens" not in attributes and "mmserve.batch.size" not in attributes
    assert text not in repr(attributes)
