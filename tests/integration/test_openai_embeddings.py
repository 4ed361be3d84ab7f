"""OpenAI-compatible /v1/embeddings against a live server, through the openai client: equals /v1/infer."""

from __future__ import annotations

import base64
import re

import httpx
import numpy as np
import openai
import pytest

from encoded_images import b64, encoded_image

TOLERANCE = 1e-5


def data_uri(image: bytes) -> str:
    return f"data:image/png;base64,{b64(image)}"


def native(server, body: dict) -> dict:
    """The same item through ``POST /v1/infer``, the reference for every answer here."""
    with server.client() as client:
        response = client.post("/v1/infer", json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def client(tiny_server):
    with openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key="unused", max_retries=0) as openai_client:
        yield openai_client


def test_models_list_names_the_served_model(client, tiny_bundle):
    models = client.models.list()
    assert [model.id for model in models.data] == [tiny_bundle.config.name]
    assert client.models.retrieve(tiny_bundle.config.name).id == tiny_bundle.config.name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("text-embedding-3-small")


def test_text_list_equals_v1_infer_with_token_usage(client, tiny_server):
    texts = ["a red bicycle", "two dogs on a beach", "caf\u00e9"]
    answer = client.embeddings.create(model="tiny", input=texts, encoding_format="float")
    assert answer.model == "tiny" and [item.index for item in answer.data] == [0, 1, 2]
    expected = [native(tiny_server, {"text": text}) for text in texts]
    for item, reference in zip(answer.data, expected):
        np.testing.assert_allclose(item.embedding, reference["text_embedding"], rtol=0, atol=TOLERANCE)
    num_tokens = sum(reference["text"]["num_tokens"] for reference in expected)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == num_tokens


def test_data_uri_image_gives_the_image_embedding(client, tiny_server):
    image = encoded_image(1)
    answer = client.embeddings.create(model="tiny", input=["a caption", data_uri(image)], encoding_format="float")
    image_reference = native(tiny_server, {"image": {"b64": b64(image)}})["image_embedding"]
    text_reference = native(tiny_server, {"text": "a caption"})
    np.testing.assert_allclose(answer.data[1].embedding, image_reference, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(answer.data[0].embedding, text_reference["text_embedding"], rtol=0, atol=TOLERANCE)
    assert answer.usage.prompt_tokens == text_reference["text"]["num_tokens"]  # images count no tokens


def test_base64_encoding_is_little_endian_float32(client, tiny_server):
    text = "encode me compactly"
    reference = native(tiny_server, {"text": text})["text_embedding"]
    decoded_by_client = client.embeddings.create(model="tiny", input=text)  # the client asks for base64
    np.testing.assert_allclose(decoded_by_client.data[0].embedding, reference, rtol=0, atol=TOLERANCE)
    with tiny_server.client() as http:
        raw = http.post("/v1/embeddings", json={"input": text, "encoding_format": "base64"}).json()
    vector = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, reference, rtol=0, atol=TOLERANCE)


def test_model_may_be_left_out_but_not_wrong(client, tiny_server):
    with tiny_server.client() as http:
        omitted = http.post("/v1/embeddings", json={"input": "no model named"})
    assert omitted.status_code == 200 and omitted.json()["model"] == "tiny"
    with pytest.raises(openai.NotFoundError) as wrong:
        client.embeddings.create(model="text-embedding-3-small", input="x")
    assert wrong.value.code == "model_not_found" and wrong.value.param == "model"


@pytest.mark.parametrize(
    ("items", "error_class", "code", "param"),
    [
        (["fine", "https://example.com/cat.png"], openai.BadRequestError, "remote_image_refused", "input[1]"),
        (["data:image/png;base64,not base64!"], openai.BadRequestError, "invalid_base64", "input[0]"),
        ([data_uri(b"not an image")], openai.APIStatusError, "unsupported_image_format", "input[0]"),
        (["data:text/plain;base64,aGk="], openai.APIStatusError, "unsupported_media_type", "input[0]"),
        (["ok", "  "], openai.UnprocessableEntityError, "empty_text", "input[1]"),
        ([], openai.UnprocessableEntityError, "empty_request", "input"),
    ],
)
def test_bad_items_get_openai_errors_naming_the_item(client, items, error_class, code, param):
    with pytest.raises(error_class) as refused:
        client.embeddings.create(model="tiny", input=items, encoding_format="float")
    body = refused.value.body
    assert refused.value.code == code and refused.value.param == param
    assert set(body) >= {"message", "type", "param", "code"} and body["type"] == "invalid_request_error"
    assert client.embeddings.create(model="tiny", input="still fine").data[0].embedding


def test_more_rows_than_a_lane_queues_is_refused_naming_input(client, tiny_server):
    max_queue_size = tiny_server.app.state.mmserve.settings.max_queue_size
    with pytest.raises(openai.APIStatusError) as refused:
        client.embeddings.create(model="tiny", input=[f"row {i}" for i in range(max_queue_size + 1)])
    assert refused.value.status_code == 413
    assert (refused.value.code, refused.value.param) == ("too_many_rows", "input")
    assert str(max_queue_size) in refused.value.body["message"]


def test_text_that_merely_starts_with_data_is_a_text(client, tiny_server):
    text = "data: see table 2"
    answer = client.embeddings.create(model="tiny", input=text, encoding_format="float")
    reference = native(tiny_server, {"text": text})["text_embedding"]
    np.testing.assert_allclose(answer.data[0].embedding, reference, rtol=0, atol=TOLERANCE)


def test_token_arrays_and_dimensions_are_refused_clearly(tiny_server, tiny_bundle):
    text_dim = tiny_bundle.model.text.hidden_size
    with tiny_server.client() as http:
        tokens = http.post("/v1/embeddings", json={"input": [[101, 2023, 102]]})
        wrong_dimensions = http.post("/v1/embeddings", json={"input": "x", "dimensions": text_dim // 2})
        native_dimensions = http.post("/v1/embeddings", json={"input": "x", "dimensions": text_dim})
    assert tokens.status_code == 422 and tokens.json()["error"]["code"] == "token_input_not_supported"
    assert wrong_dimensions.status_code == 422 and wrong_dimensions.json()["error"]["param"] == "dimensions"
    assert native_dimensions.status_code == 200
    assert len(native_dimensions.json()["data"][0]["embedding"]) == text_dim


def test_text_limit_is_shared_with_v1_infer(live_server_factory):
    with live_server_factory(max_text_chars=20) as server:
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as limited:
            with pytest.raises(openai.UnprocessableEntityError) as refused:
                limited.embeddings.create(model="tiny", input=["short", "x" * 21])
    assert refused.value.code == "text_too_long" and refused.value.param == "input[1]"
    assert "20" in refused.value.message and "MMSERVE_MAX_TEXT_CHARS" in refused.value.message


def test_embeddings_are_counted_under_their_own_route(client, tiny_server):
    def count(metrics: str, code: str) -> float:
        pattern = rf'^mmserve_requests_total\{{code="{code}",route="openai"\}} (\S+)$'
        match = re.search(pattern, metrics, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    before = count(httpx.get(f"{tiny_server.url}/metrics").text, "200")
    client.embeddings.create(model="tiny", input="count me")
    metrics = httpx.get(f"{tiny_server.url}/metrics").text
    assert count(metrics, "200") == before + 1
    assert 'mmserve_request_duration_seconds_count{route="openai"}' in metrics


def test_timeout_ms_is_an_extension_field_whose_504_names_it(client, tiny_server):
    """A 504 tells the client that ``timeout_ms`` sets the deadline: /v1/embeddings takes it (as ``truncate``),
    so the client can act on it. 1 ms is far shorter than 128 texts take to tokenize and compute, whichever
    check meets the deadline first."""
    generous = client.embeddings.create(model="tiny", input="on time", encoding_format="float",
                                        extra_body={"timeout_ms": 60_000})
    np.testing.assert_allclose(generous.data[0].embedding, native(tiny_server, {"text": "on time"})["text_embedding"],
                               rtol=0, atol=TOLERANCE)
    with pytest.raises(openai.APIStatusError) as late:
        client.embeddings.create(model="tiny", input=[f"too late, text number {i} " * 2 for i in range(128)],
                                 extra_body={"timeout_ms": 1})
    assert late.value.status_code == 504
    assert (late.value.code, late.value.param) == ("deadline_exceeded", "timeout_ms")
    with tiny_server.client() as http:
        zero = http.post("/v1/embeddings", json={"input": "x", "timeout_ms": 0})
    assert zero.status_code == 422 and zero.json()["error"]["param"] == "timeout_ms"


@pytest.mark.parametrize("value, code", [("", "empty_text"), ("https://example.com/a.png", "remote_image_refused"),
                                         ("data:image/png;base64,!!", "invalid_base64")])
def test_a_single_string_inputs_error_names_input_whichever_check_refuses_it(client, value, code):
    """As a long single text's 422 does (the intake's check): one string is ``input``, not ``input[0]``."""
    with pytest.raises(openai.APIStatusError) as refused:
        client.embeddings.create(model="tiny", input=value)
    assert (refused.value.code, refused.value.param) == (code, "input")
    with pytest.raises(openai.APIStatusError) as in_a_list:
        client.embeddings.create(model="tiny", input=["fine", value])
    assert (in_a_list.value.code, in_a_list.value.param) == (code, "input[1]")


def test_a_data_uri_in_upper_case_is_the_same_image(client):
    image = b64(encoded_image(2))
    lower, upper = client.embeddings.create(model="tiny", encoding_format="float", input=[
        f"data:image/png;base64,{image}", f"DATA:IMAGE/PNG;BASE64,{image}"]).data
    np.testing.assert_array_equal(upper.embedding, lower.embedding)


def test_a_trailing_slash_is_a_404_in_the_paths_shape_not_a_redirect(tiny_server):
    with tiny_server.client() as http:
        embeddings = http.post("/v1/embeddings/", json={"input": "x"})
        infer = http.post("/v1/infer/", json={"text": "x"})
    assert embeddings.status_code == 404 and embeddings.json()["error"]["code"] == "route_not_found"
    assert set(embeddings.json()["error"]) == {"message", "type", "param", "code"}, "OpenAI's shape"
    assert infer.status_code == 404 and infer.json()["error"]["code"] == "route_not_found"


def test_the_models_paths_refuse_in_openais_shape_before_their_route_runs(client):
    """A wrong method on /v1/models (routing's 405, as a bad key's 401 there) is in OpenAI's shape, so the
    openai client reads its code and param as it does /v1/embeddings' and /v1/models/{id}'s own 404."""
    for path in ("/models", "/models/tiny"):
        with pytest.raises(openai.APIStatusError) as refused:
            client.post(path, cast_to=object, body={})
        assert refused.value.status_code == 405
        assert (refused.value.code, refused.value.param) == ("method_not_allowed", "method")
        assert set(refused.value.body) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("value, param, named", [([None], "input[0]", "null"), (["ok", {"text": "x"}], "input[1]", "dict"),
                                                 ({"text": "x"}, "input", "dict"), (3.5, "input", "float")])
def test_an_input_of_the_wrong_type_is_named_plainly(client, value, param, named):
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.embeddings.create(model="tiny", input=value)
    assert (refused.value.code, refused.value.param) == ("invalid_request", param)
    message = refused.value.body["message"]
    assert message.startswith(f"{param} must be a string") and named in message
    assert ".str" not in message, "pydantic's union branch is no field of the request"
