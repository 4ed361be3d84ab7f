"""The hot-path JSON: numpy embeddings round-trip exactly, and odd bodies parse as they did."""

from __future__ import annotations

import json

import numpy as np
import pytest

from server.ingest import json_body


def test_float32_embeddings_read_back_to_the_same_float32_values():
    rng = np.random.default_rng(3)
    embedding = (rng.standard_normal(1024) * 10.0 ** rng.integers(-8, 8, 1024)).astype(np.float32)
    document = json.loads(json_body.dumps({"image_embedding": embedding, "score": np.float32(0.25)}))
    assert np.array_equal(np.asarray(document["image_embedding"], dtype=np.float32), embedding)
    assert document["score"] == 0.25


def test_a_lone_surrogate_escape_still_parses_so_the_text_check_can_name_its_field():
    assert json_body.loads(b'{"text": "a\\ud800b"}') == {"text": "a\ud800b"}


@pytest.mark.parametrize("body", [b"{", b'{"text": }', b"\xff\xfe"])
def test_what_is_not_json_raises_the_standard_error(body):
    with pytest.raises((json_body.JSONDecodeError, UnicodeDecodeError)):
        json_body.loads(body)


@pytest.mark.parametrize("body", [
    b"[" * 1025 + b"]" * 1025,  # orjson's own limit: one level past it
    b'{"a": ' * 5000 + b"1" + b"}" * 5000,
    b"[" * 1000 + b'"\\ud800"' + b"]" * 1000,  # orjson refuses the surrogate; the standard library recurses too far
])
def test_a_body_nested_too_deep_is_not_json_and_the_message_says_the_limit(body):
    with pytest.raises(json_body.JSONDecodeError) as raised:
        json_body.loads(body)
    assert f"the limit of {json_body.MAX_DEPTH} levels" in str(raised.value)


def test_a_body_nested_to_the_limit_still_parses():
    document = json_body.loads(b"[" * json_body.MAX_DEPTH + b"]" * json_body.MAX_DEPTH)
    for _ in range(json_body.MAX_DEPTH - 1):
        (document,) = document
    assert document == []
