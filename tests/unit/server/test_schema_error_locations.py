"""A validation error names the field as the client wrote it: the image kind a body's keys chose, not the other."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from server.protocols.zero_shot_schemas import ClassifyRequest, RankRequest
from server.schemas import InferRequest, error_location


def _first_error(model, document: dict) -> tuple[str, str]:
    with pytest.raises(ValidationError) as refused:
        model.model_validate(document)
    first = refused.value.errors()[0]
    return error_location(first["loc"]), first["msg"]


@pytest.mark.parametrize(("model", "document", "field"), [
    (InferRequest, {"image": {"uint8": {"shape": [1, 3], "b64": "AAAA"}}}, "image.uint8.shape"),
    (InferRequest, {"image": {"uint8": {"shape": "1,1,3", "b64": "AAAA"}}}, "image.uint8.shape"),
    (InferRequest, {"image": {"uint8": {"shape": [1, 1, 3], "b64": "AAAA", "dtype": "u8"}}}, "image.uint8.dtype"),
    (InferRequest, {"images": [{"b64": "AAAA"}, {"uint8": {"shape": [0, 0], "b64": "AAAA"}}]}, "images[1].uint8.shape"),
    (InferRequest, {"image": {"b64": ""}}, "image.b64"),
    (InferRequest, {"image": "not an object"}, "image"),
    (InferRequest, {"text": "hi", "timeout_ms": 1e20}, "timeout_ms"),
    (ClassifyRequest, {"image": {"uint8": {"shape": [1], "b64": "AA"}}, "labels": ["a"]}, "image.uint8.shape"),
    (ClassifyRequest, {"image": {"b64": "AA"}, "labels": ["a", 5]}, "labels[1]"),
    (RankRequest, {"query": {"uint8": {"shape": [1], "b64": "AA"}}, "candidates": ["a"]}, "query.uint8.shape"),
    (RankRequest, {"query": "q", "candidates": ["a", 5]}, "candidates[1]"),
])
def test_the_error_names_the_field_inside_the_kind_the_keys_chose(model, document, field):
    location, message = _first_error(model, document)
    assert location == field, message
    assert "EncodedImage" not in location and "b64: Field required" not in message


def test_a_timeout_written_past_64_bits_is_refused_by_its_limit():
    _, message = _first_error(InferRequest, {"text": "hi", "timeout_ms": 1e20})
    assert message == "Input should be less than or equal to 3600000"
    assert InferRequest.model_validate({"text": "hi", "timeout_ms": 5.0}).timeout_ms == 5
