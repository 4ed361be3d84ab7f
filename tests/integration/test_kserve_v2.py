"""Open Inference Protocol v2 against a live server, through tritonclient: outputs equal /v1/infer."""

from __future__ import annotations

import re

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from encoded_images import b64, encoded_image

TOLERANCE = 1e-5


def native(server, body: dict) -> dict:
    """The same item through ``POST /v1/infer``, the reference for every v2 answer."""
    with server.client() as client:
        response = client.post("/v1/infer", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def bytes_input(name: str, elements: list[bytes], binary_data: bool = True) -> triton_http.InferInput:
    tensor = triton_http.InferInput(name, [len(elements)], "BYTES")
    tensor.set_data_from_numpy(np.array(elements, dtype=object), binary_data=binary_data)
    return tensor


@pytest.fixture(scope="module")
def triton(tiny_server):
    client = triton_http.InferenceServerClient(url=tiny_server.url.removeprefix("http://"))
    yield client
    client.close()


def metric_value(text: str, name: str, labels: str) -> float:
    match = re.search(rf"^{name}\{{{labels}\}} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_health_server_and_model_metadata(triton, tiny_server, tiny_bundle):
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("tiny") and triton.is_model_ready("tiny", model_version="1")
    assert not triton.is_model_ready("no-such-model")
    server = triton.get_server_metadata()
    assert server["name"] == "mmserve" and "binary_tensor_data" in server["extensions"]
    metadata = triton.get_model_metadata("tiny")
    assert metadata == triton.get_model_metadata("tiny", model_version="1")
    assert metadata["name"] == tiny_bundle.config.name and metadata["versions"] == ["1"]
    inputs = {spec["name"]: (spec["datatype"], spec["shape"]) for spec in metadata["inputs"]}
    assert inputs == {"text": ("BYTES", [-1]), "image": ("BYTES", [-1, -1]), "image_uint8": ("UINT8", [-1, -1, -1, 3])}
    answer = native(tiny_server, {"text": "sizes", "image": {"b64": b64(encoded_image(0))}})
    outputs = {spec["name"]: (spec["datatype"], spec["shape"]) for spec in metadata["outputs"]}
    assert outputs == {
        "image_embedding": ("FP32", [-1, len(answer["image_embedding"])]),
        "image_embeddings": ("FP32", [-1, -1, len(answer["image_embedding"])]),
        "text_embedding": ("FP32", [-1, len(answer["text_embedding"])]),
        "fused_embedding": ("FP32", [-1, len(answer["fused_embedding"])]),
    }  # no score: the preset has no calibrated score; no match_score: its head is untrained


def test_binary_image_and_text_rows_are_fused_and_equal_v1_infer(triton, tiny_server):
    images = [encoded_image(1), encoded_image(2, (64, 20))]
    texts = [b"a red bicycle", "caf\u00e9 au lait".encode()]
    result = triton.infer("tiny", [bytes_input("text", texts), bytes_input("image", images)], request_id="r-1")
    assert result.get_response()["id"] == "r-1" and result.get_response()["model_version"] == "1"
    for row, (text, image) in enumerate(zip(texts, images)):
        expected = native(tiny_server, {"text": text.decode(), "image": {"b64": b64(image)}})
        for name in ("image_embedding", "text_embedding", "fused_embedding"):
            np.testing.assert_allclose(result.as_numpy(name)[row], expected[name], rtol=0, atol=TOLERANCE)
        assert result.as_numpy("score") is None and "score" not in expected


def test_rows_of_several_images_padded_with_empty_elements_equal_v1_infer_images(triton, tiny_server):
    rows = [[encoded_image(31), encoded_image(32, (30, 50)), encoded_image(33)], [encoded_image(34), b"", b""]]
    texts = [b"three photos of a kitchen", b"one photo"]
    images = triton_http.InferInput("image", [2, 3], "BYTES")
    images.set_data_from_numpy(np.array(rows, dtype=object), binary_data=True)
    result = triton.infer("tiny", [bytes_input("text", texts), images])
    assert result.as_numpy("image_embedding") is None
    embeddings = result.as_numpy("image_embeddings")  # (2, 3, E_v)
    assert embeddings.shape[:2] == (2, 3)
    for row, (text, row_images) in enumerate(zip(texts, rows)):
        present = [image for image in row_images if image]
        expected = native(tiny_server, {"text": text.decode(), "images": [{"b64": b64(image)} for image in present]})
        np.testing.assert_allclose(embeddings[row, : len(present)], expected["image_embeddings"], rtol=0,
                                   atol=TOLERANCE)
        assert not embeddings[row, len(present):].any()  # the padding's rows are zeros
        np.testing.assert_allclose(result.as_numpy("fused_embedding")[row], expected["fused_embedding"], rtol=0,
                                   atol=TOLERANCE)


def test_padding_before_an_image_is_refused_naming_the_row(triton):
    images = triton_http.InferInput("image", [1, 2], "BYTES")
    images.set_data_from_numpy(np.array([[b"", encoded_image(35)]], dtype=object), binary_data=True)
    with pytest.raises(InferenceServerException) as refused:
        triton.infer("tiny", [images])
    assert refused.value.message().startswith("invalid_tensor_shape: row 0"), refused.value.message()


def test_a_row_of_padding_only_without_text_is_refused_naming_the_input_and_row(triton):
    """v2 has no body to name: the row's error names the image input and the row, as other row errors do."""
    images = triton_http.InferInput("image", [2, 2], "BYTES")
    images.set_data_from_numpy(np.array([[encoded_image(35), b""], [b"", b""]], dtype=object), binary_data=True)
    with pytest.raises(InferenceServerException) as refused:
        triton.infer("tiny", [images])
    assert refused.value.status() == "422", refused.value.message()
    assert refused.value.message().startswith("empty_request: row 1: image row 1 is only padding"), \
        refused.value.message()


def test_json_texts_batch_with_json_outputs_equals_v1_infer(triton, tiny_server):
    texts = [b"first text", b"the second, longer text"]
    outputs = [triton_http.InferRequestedOutput("text_embedding", binary_data=False)]
    result = triton.infer("tiny", [bytes_input("text", texts, binary_data=False)], outputs=outputs)
    entry = result.get_output("text_embedding")
    assert "data" in entry and entry["shape"][0] == 2  # sent in the JSON header, not as binary
    for row, text in enumerate(texts):
        expected = native(tiny_server, {"text": text.decode()})["text_embedding"]
        np.testing.assert_allclose(result.as_numpy("text_embedding")[row], expected, rtol=0, atol=TOLERANCE)


def test_uint8_pixels_equal_v1_infer_raw_pixels(triton, tiny_server):
    pixels = np.random.default_rng(3).integers(0, 256, size=(2, 20, 50, 3), dtype=np.uint8)
    tensor = triton_http.InferInput("image_uint8", list(pixels.shape), "UINT8")
    tensor.set_data_from_numpy(pixels)
    result = triton.infer("tiny", [tensor])
    assert result.as_numpy("text_embedding") is None
    for row in range(2):
        body = {"image": {"uint8": {"shape": [20, 50, 3], "b64": b64(pixels[row].tobytes())}}}
        expected = native(tiny_server, body)["image_embedding"]
        np.testing.assert_allclose(result.as_numpy("image_embedding")[row], expected, rtol=0, atol=TOLERANCE)


def test_only_the_requested_outputs_come_back(triton, tiny_server):
    image = encoded_image(4)
    outputs = [triton_http.InferRequestedOutput("fused_embedding")]
    result = triton.infer("tiny", [bytes_input("text", [b"just the fusion"]), bytes_input("image", [image])],
                          outputs=outputs)
    assert [output["name"] for output in result.get_response()["outputs"]] == ["fused_embedding"]
    assert result.as_numpy("image_embedding") is None
    expected = native(tiny_server, {"text": "just the fusion", "image": {"b64": b64(image)}})["fused_embedding"]
    np.testing.assert_allclose(result.as_numpy("fused_embedding"), [expected], rtol=0, atol=TOLERANCE)


def test_json_images_are_base64_strings(tiny_server):
    image = encoded_image(5)
    body = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": [b64(image)]}]}
    with tiny_server.client() as client:
        answer = client.post("/v2/models/tiny/infer", json=body)
    assert answer.status_code == 200, answer.text
    assert "inference-header-content-length" not in answer.headers
    output = {entry["name"]: entry for entry in answer.json()["outputs"]}["image_embedding"]
    expected = native(tiny_server, {"image": {"b64": b64(image)}})["image_embedding"]
    np.testing.assert_allclose(output["data"], expected, rtol=0, atol=TOLERANCE)


def test_unknown_model_and_version_raise_in_the_client(triton):
    with pytest.raises(InferenceServerException) as unknown:
        triton.infer("no-such-model", [bytes_input("text", [b"x"])])
    assert unknown.value.status() == "404" and "model_not_found" in unknown.value.message()
    with pytest.raises(InferenceServerException) as metadata:
        triton.get_model_metadata("no-such-model")
    assert metadata.value.status() == "404"
    with pytest.raises(InferenceServerException) as version:
        triton.infer("tiny", [bytes_input("text", [b"x"])], model_version="2")
    assert version.value.status() == "404" and "model_version_not_found" in version.value.message()


@pytest.mark.parametrize(
    ("inputs", "outputs", "status", "code"),
    [
        (lambda: [bytes_input("text", [b"fine", b"   "])], None, "422", "empty_text: row 1"),
        (lambda: [bytes_input("image", [encoded_image(6), b"not an image"])], None, "415",
         "unsupported_image_format: row 1"),
        (lambda: [bytes_input("text", [b"\xff\xfe"])], None, "400", "invalid_text_encoding: row 0"),
        (lambda: [bytes_input("text", [b"x"])], ["fused_embedding"], "400", "output_not_available"),
        (lambda: [bytes_input("text", [b"x"])], ["score"], "400", "unknown_output"),  # the preset has none
        (lambda: [bytes_input("prompt", [b"x"])], None, "400", "unknown_input"),
        (lambda: [bytes_input("text", [b"a", b"b"]), bytes_input("image", [encoded_image(7)])], None, "400",
         "invalid_tensor_shape"),
    ],
)
def test_bad_rows_get_protocol_errors_naming_code_and_row(triton, inputs, outputs, status, code):
    requested = None if outputs is None else [triton_http.InferRequestedOutput(name) for name in outputs]
    with pytest.raises(InferenceServerException) as refused:
        triton.infer("tiny", inputs(), outputs=requested)
    assert refused.value.status() == status
    assert refused.value.message().startswith(code)
    assert triton.infer("tiny", [bytes_input("text", [b"still fine"])]).as_numpy("text_embedding").shape[0] == 1


def test_image_pixel_limit_is_shared_with_v1_infer(live_server_factory):
    pixels = np.zeros((1, 40, 40, 3), dtype=np.uint8)
    with live_server_factory(max_image_pixels=1000) as server:
        client = triton_http.InferenceServerClient(url=server.url.removeprefix("http://"))
        tensor = triton_http.InferInput("image_uint8", list(pixels.shape), "UINT8")
        tensor.set_data_from_numpy(pixels)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("tiny", [tensor])
        client.close()
    assert refused.value.status() == "413"
    assert refused.value.message().startswith("image_too_large: row 0") and "1000" in refused.value.message()


def test_malformed_binary_body_is_400_over_http(tiny_server):
    header = b'{"inputs":[{"name":"text","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":9}}]}'
    body = header + (50).to_bytes(4, "little") + b"short"
    with tiny_server.client() as client:
        cut = client.post("/v2/models/tiny/infer", content=body,
                          headers={"Inference-Header-Content-Length": str(len(header))})
        lying = client.post("/v2/models/tiny/infer", content=body,
                            headers={"Inference-Header-Content-Length": "x"})
    assert cut.status_code == 400 and cut.json()["error"].startswith("invalid_tensor_data")
    assert lying.status_code == 400 and lying.json()["error"].startswith("invalid_header_length")


def test_rows_of_one_request_are_batched_together(live_server_factory):
    texts = [f"row {i}".encode() for i in range(4)]

    def text_batches(metrics: str) -> tuple[float, float]:
        return (metric_value(metrics, "mmserve_batch_size_count", 'lane="text"'),
                metric_value(metrics, "mmserve_batch_size_sum", 'lane="text"'))

    with live_server_factory(max_queue_delay_ms=500.0) as server:
        client = triton_http.InferenceServerClient(url=server.url.removeprefix("http://"))
        result = client.infer("tiny", [bytes_input("text", texts)])
        client.close()
        metrics = httpx.get(f"{server.url}/metrics").text
    assert result.as_numpy("text_embedding").shape[0] == 4
    assert text_batches(metrics) == (1.0, 4.0)


def test_v2_requests_are_counted_under_their_own_route(triton, tiny_server):
    before = metric_value(httpx.get(f"{tiny_server.url}/metrics").text, "mmserve_requests_total",
                          'code="200",route="v2"')
    triton.infer("tiny", [bytes_input("text", [b"count me"])])
    with pytest.raises(InferenceServerException):
        triton.infer("no-such-model", [bytes_input("text", [b"x"])])
    metrics = httpx.get(f"{tiny_server.url}/metrics").text
    assert metric_value(metrics, "mmserve_requests_total", 'code="200",route="v2"') == before + 1
    assert metric_value(metrics, "mmserve_requests_total", 'code="404",route="v2"') >= 1
    assert 'mmserve_request_duration_seconds_count{route="v2"}' in metrics


def test_row_count_and_body_limits_answer_before_any_compute(live_server_factory):
    with live_server_factory(max_queue_size=2, max_body_bytes=2_000, max_queue_delay_ms=500.0) as server:
        client = triton_http.InferenceServerClient(url=server.url.removeprefix("http://"))
        with pytest.raises(InferenceServerException) as too_many:
            client.infer("tiny", [bytes_input("text", [b"a", b"b", b"c"])])
        with pytest.raises(InferenceServerException) as too_big:
            client.infer("tiny", [bytes_input("text", [b"x" * 3_000])])
        assert client.infer("tiny", [bytes_input("text", [b"a", b"b"])]).as_numpy("text_embedding").shape[0] == 2
        client.close()
        metrics = httpx.get(f"{server.url}/metrics").text
    assert too_many.value.status() == "413" and too_many.value.message().startswith("too_many_rows")
    assert "MMSERVE_MAX_QUEUE_SIZE" in too_many.value.message()
    assert too_big.value.status() == "413"
    assert metric_value(metrics, "mmserve_requests_total", 'code="413",route="v2"') == 2.0
    assert metric_value(metrics, "mmserve_batch_size_count", 'lane="text"') == 1.0


def test_request_parameters_truncate_priority_and_timeout(triton, tiny_server, tiny_bundle):
    long_text = "y" * (tiny_bundle.tokenizer.max_tokens + 5)
    with pytest.raises(InferenceServerException) as refused:
        triton.infer("tiny", [bytes_input("text", [long_text.encode()])])
    assert refused.value.status() == "422" and refused.value.message().startswith("text_too_long: row 0")
    truncated = triton.infer("tiny", [bytes_input("text", [long_text.encode()])], priority=1, timeout=30_000_000,
                             parameters={"truncate": True})
    expected = native(tiny_server, {"text": long_text, "truncate": True, "priority": "high"})["text_embedding"]
    np.testing.assert_allclose(truncated.as_numpy("text_embedding")[0], expected, rtol=0, atol=TOLERANCE)
    with pytest.raises(InferenceServerException) as bad_truncate:
        triton.infer("tiny", [bytes_input("text", [b"x"])], parameters={"truncate": "yes"})
    assert bad_truncate.value.status() == "400" and bad_truncate.value.message().startswith("invalid_parameter")
