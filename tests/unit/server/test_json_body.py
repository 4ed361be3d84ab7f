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
