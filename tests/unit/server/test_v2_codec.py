"""The Open Inference Protocol v2 codec: round trips, tritonclient's own bytes, malformed bodies -> 400."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import tritonclient.http as triton_http
from tritonclient.utils import serialize_byte_tensor

from server.errors import ApiError
from server.protocols.kserve_v2_codec import (
    RequestedOutput,
    Tensor,
    V2InferRequest,
    V2InferResponse,
    decode_infer_request,
    deserialize_bytes_elements,
    encode_infer_request,
    encode_infer_response,
    serialize_bytes_elements,
)


def bytes_tensor(name: str, elements: list[bytes], is_binary: bool) -> Tensor:
    data = np.empty(len(elements), dtype=object)
    data[:] = elements
    return Tensor(name, "BYTES", (len(elements),), data, is_binary)


def decode(encoded) -> V2InferRequest:
    header = None if encoded.header_length is None else str(encoded.header_length)
    return decode_infer_request(encoded.body, header)


def assert_same_tensor(got: Tensor, want: Tensor) -> None:
    def identity(tensor: Tensor) -> tuple:
        return tensor.name, tensor.datatype, tensor.shape, tensor.is_binary

    assert identity(got) == identity(want)
    if want.datatype == "BYTES":
        assert got.data.ravel().tolist() == want.data.ravel().tolist()
    else:
        assert got.data.dtype == want.data.dtype
        np.testing.assert_array_equal(got.data, want.data)


def test_a_request_survives_encode_then_decode_in_both_forms():
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(2, 3, 4, 3), dtype=np.uint8)
    request = V2InferRequest(
        inputs=(
            bytes_tensor("text", [b"a red bicycle", "caf\u00e9 \u2615".encode()], is_binary=True),
            Tensor("image_uint8", "UINT8", pixels.shape, pixels, is_binary=True),
            Tensor("weights", "FP32", (2, 2), rng.standard_normal((2, 2)).astype(np.float32)),
            bytes_tensor("labels", [b"x", b""], is_binary=False),
            Tensor("flags", "BOOL", (3,), np.array([True, False, True])),
        ),
        outputs=(RequestedOutput("text_embedding", True), RequestedOutput("score", False)),
        request_id="req-7",
        parameters={"priority": 1, "timeout": 5000},
    )
    encoded = encode_infer_request(request)
    assert encoded.header_length is not None
    decoded = decode(encoded)
    assert decoded.request_id == "req-7"
    assert decoded.parameters == {"priority": 1, "timeout": 5000}
    assert decoded.outputs == request.outputs
    assert len(decoded.inputs) == len(request.inputs)
    for got, want in zip(decoded.inputs, request.inputs):
        assert_same_tensor(got, want)


def test_a_json_only_request_has_no_header_length():
    request = V2InferRequest(inputs=(bytes_tensor("text", [b"only json"], is_binary=False),))
    encoded = encode_infer_request(request)
    assert encoded.header_length is None
    assert json.loads(encoded.body)["inputs"][0]["data"] == ["only json"]
    assert decode(encoded).inputs[0].data.tolist() == [b"only json"]


def test_bytes_elements_match_tritonclient_serialization():
    elements = [b"", b"abc", bytes(range(256)), "\u00fc".encode()]
    ours = serialize_bytes_elements(elements)
    theirs = serialize_byte_tensor(np.array(elements, dtype=object)).item()
    assert ours == theirs
    assert deserialize_bytes_elements(ours, len(elements), "t") == elements


def test_decodes_what_tritonclient_sends():
    texts = np.array([b"first", b"second row"], dtype=object)
    pixels = np.arange(2 * 2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 2, 3)
    text_input = triton_http.InferInput("text", [2], "BYTES")
    text_input.set_data_from_numpy(texts)
    pixel_input = triton_http.InferInput("image_uint8", list(pixels.shape), "UINT8")
    pixel_input.set_data_from_numpy(pixels, binary_data=False)
    outputs = [triton_http.InferRequestedOutput("text_embedding", binary_data=True)]
    body, header_length = triton_http.InferenceServerClient.generate_request_body(
        [text_input, pixel_input], outputs=outputs, request_id="r1", priority=3)
    decoded = decode_infer_request(body, str(header_length))
    by_name = {tensor.name: tensor for tensor in decoded.inputs}
    assert by_name["text"].data.tolist() == [b"first", b"second row"] and by_name["text"].is_binary
    np.testing.assert_array_equal(by_name["image_uint8"].data, pixels)
    assert not by_name["image_uint8"].is_binary
    assert decoded.outputs == (RequestedOutput("text_embedding", True),)
    assert decoded.parameters["priority"] == 3 and decoded.request_id == "r1"


@pytest.mark.parametrize("is_binary", [True, False])
def test_tritonclient_reads_our_responses(is_binary):
    rng = np.random.default_rng(1)
    embedding = rng.standard_normal((3, 5)).astype(np.float32)
    score = rng.standard_normal(3).astype(np.float32)
    response = V2InferResponse(
        model_name="tiny", model_version="1", request_id="abc",
        outputs=(Tensor("fused_embedding", "FP32", embedding.shape, embedding, is_binary),
                 Tensor("score", "FP32", score.shape, score, is_binary=False)),
    )
    encoded = encode_infer_response(response)
    assert (encoded.header_length is not None) == is_binary
    result = triton_http.InferenceServerClient.parse_response_body(
        encoded.body, header_length=encoded.header_length)
    assert result.get_response()["model_name"] == "tiny" and result.get_response()["id"] == "abc"
    np.testing.assert_array_equal(result.as_numpy("fused_embedding").reshape(3, 5), embedding)
    np.testing.assert_array_equal(result.as_numpy("score"), score)


def binary_request(header: dict, tail: bytes) -> tuple[bytes, str]:
    header_bytes = json.dumps(header).encode()
    return header_bytes + tail, str(len(header_bytes))


def text_header(size: int, shape: list[int]) -> dict:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape,
                        "parameters": {"binary_data_size": size}}]}


@pytest.mark.parametrize("header_length", ["-3", "abc", "1e3", "99999"])
def test_a_malformed_header_length_is_400(header_length):
    body = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}).encode()
    with pytest.raises(ApiError) as refused:
        decode_infer_request(body, header_length)
    assert refused.value.status == 400 and refused.value.code == "invalid_header_length"


def test_a_header_length_that_cuts_the_json_is_400():
    body, _ = binary_request(text_header(5, [1]), struct.pack("<I", 1) + b"x")
    with pytest.raises(ApiError) as refused:
        decode_infer_request(body, "10")
    assert refused.value.status == 400 and refused.value.code == "invalid_json"


@pytest.mark.parametrize(
    ("tail", "declared_size", "shape"),
    [
        (struct.pack("<I", 100) + b"short", 9, [1]),  # element claims more bytes than remain
        (struct.pack("<I", 3) + b"abc" + b"\x01\x00", 9, [2]),  # second length prefix cut off
        (struct.pack("<I", 3) + b"abc", 8, [1]),  # binary_data_size runs past the body
        (struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"b", 10, [1]),  # more elements than the shape
        (struct.pack("<I", 1) + b"a", 5, [3]),  # fewer bytes than 3 length prefixes need
    ],
)
def test_bytes_that_run_past_the_buffer_are_400_naming_the_input(tail, declared_size, shape):
    body, header_length = binary_request(text_header(declared_size, shape), tail)
    with pytest.raises(ApiError) as refused:
        decode_infer_request(body, header_length)
    assert refused.value.status == 400 and refused.value.code == "invalid_tensor_data"
    assert refused.value.field == "text" and "text" in refused.value.message


def test_bytes_after_the_last_binary_input_are_400():
    body, header_length = binary_request(text_header(5, [1]), struct.pack("<I", 1) + b"x" + b"junk")
    with pytest.raises(ApiError) as refused:
        decode_infer_request(body, header_length)
    assert refused.value.code == "invalid_tensor_data" and "4 bytes" in refused.value.message


@pytest.mark.parametrize(
    ("entry", "code"),
    [
        ({"name": "x", "datatype": "UINT8", "shape": [2, 2], "data": [1, 2, 3]}, "invalid_tensor_data"),
        ({"name": "x", "datatype": "UINT8", "shape": [2], "data": [1, 256]}, "invalid_tensor_data"),
        ({"name": "x", "datatype": "UINT8", "shape": [2], "data": [1, 2.5]}, "invalid_tensor_data"),
        ({"name": "x", "datatype": "BYTES", "shape": [1], "data": [5]}, "invalid_tensor_data"),
        ({"name": "x", "datatype": "BF16", "shape": [1], "data": [1.0]}, "unsupported_datatype"),
        ({"name": "x", "datatype": "FP32", "shape": [-1], "data": [1.0]}, "invalid_tensor_shape"),
        ({"name": "x", "datatype": "FP32", "shape": [1]}, "invalid_request"),
        ({"name": "x", "datatype": "FP32", "shape": [1],
          "parameters": {"shared_memory_region": "r"}}, "unsupported_parameter"),
    ],
)
def test_malformed_tensors_are_400_with_a_named_code(entry, code):
    with pytest.raises(ApiError) as refused:
        decode_infer_request(json.dumps({"inputs": [entry]}).encode(), None)
    assert refused.value.status == 400 and refused.value.code == code
    assert refused.value.field == "x"


def test_a_uint8_binary_size_must_match_its_shape():
    header = {"inputs": [{"name": "p", "datatype": "UINT8", "shape": [2, 2, 3],
                          "parameters": {"binary_data_size": 11}}]}
    body, header_length = binary_request(header, bytes(11))
    with pytest.raises(ApiError) as refused:
        decode_infer_request(body, header_length)
    assert refused.value.code == "invalid_tensor_data" and "12 bytes" in refused.value.message


def test_body_that_is_not_json_is_400():
    with pytest.raises(ApiError) as refused:
        decode_infer_request(b"\xff{nope", None)
    assert refused.value.status == 400 and refused.value.code == "invalid_json"
    with pytest.raises(ApiError) as no_inputs:
        decode_infer_request(b'{"inputs": []}', None)
    assert no_inputs.value.code == "invalid_request"

