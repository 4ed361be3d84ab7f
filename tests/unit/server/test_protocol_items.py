"""Protocol items -> rows: v2 request parameters and OpenAI input strings, decided without a server."""

from __future__ import annotations

import base64

import pytest

from router.segments import ImageContent
from server.errors import ApiError
from server.protocols.kserve_v2_model import RowOptions, row_options
from server.protocols.openai_embeddings import item_from_string
from server.settings import Settings


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({}, RowOptions("normal", None, False)),
        ({"priority": 0}, RowOptions("normal", None, False)),
        ({"priority": 1}, RowOptions("high", None, False)),
        ({"priority": 2}, RowOptions("normal", None, False)),
        ({"priority": 7}, RowOptions("low", None, False)),
        ({"priority": "low"}, RowOptions("low", None, False)),
        ({"timeout": 1}, RowOptions("normal", 1, False)),
        ({"timeout": 2_500_001}, RowOptions("normal", 2_501, False)),
        ({"truncate": True, "binary_data_output": True}, RowOptions("normal", None, True)),
    ],
)
def test_triton_parameters_map_to_row_options(parameters, expected):
    assert row_options(parameters) == expected


@pytest.mark.parametrize(
    "parameters",
    [{"priority": -1}, {"priority": "urgent"}, {"priority": True}, {"timeout": 0}, {"timeout": 1.5},
     {"truncate": 1}],
)
def test_bad_parameters_are_400_naming_the_parameter_as_v2_does(parameters):
    """``parameters.timeout``, as a 504's field and hint name it, not the bare key."""
    with pytest.raises(ApiError) as refused:
        row_options(parameters)
    assert refused.value.status == 400 and refused.value.code == "invalid_parameter"
    assert refused.value.field == f"parameters.{next(iter(parameters))}"


def test_openai_strings_are_images_texts_or_refused_urls():
    settings = Settings(preset="tiny")
    image = item_from_string("data:image/png;base64," + base64.b64encode(b"\x89PNG fake").decode(), settings)
    assert image.images == (ImageContent(encoded=b"\x89PNG fake"),) and image.text is None and image.route == "vision"
    for text in ("data: see table 2", "https://example.com is a site", "plain words"):
        item = item_from_string(text, settings)
        assert item.text == text and item.images == ()
    for url in ("https://example.com/cat.png", "HTTP://example.com/a.jpg"):
        with pytest.raises(ApiError) as refused:
            item_from_string(url, settings)
        assert refused.value.status == 400 and refused.value.code == "remote_image_refused"
    with pytest.raises(ApiError) as not_base64:
        item_from_string("data:image/png,rawbytes", settings)
    assert not_base64.value.code == "invalid_data_uri"
