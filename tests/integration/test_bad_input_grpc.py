"""The bad-input matrix (``test_bad_input_matrix``) over gRPC: each refusal the binary v2 route gives, the same.

Every case of ``REFUSALS`` for ``v2_binary`` that is an input (a text, an
image, raw pixels; not a malformed HTTP body) is sent as a
``ModelInferRequest`` built with the messages tritonclient ships: tensors in
``raw_input_contents`` as tritonclient sends them, and once more in typed
``contents`` (``bytes_contents``, ``uint_contents``). The answer must carry
the gRPC status of the HTTP status (README's table), the same error code in
the JSON error text, one more ``mmserve_requests_total{route="v2_grpc"}`` of
that HTTP status, and the next ordinary request must be served. Malformations
only a gRPC message can have (bytes that are no message, raw contents that do
not match the inputs) have their own cases.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from server.settings import Settings
from tests.conftest import LiveServer, run_live_server
from tests.encoded_images import encoded_image
from tests.integration.test_bad_input_matrix import REFUSALS, Item

GRPC_STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
               415: grpc.StatusCode.INVALID_ARGUMENT, 422: grpc.StatusCode.INVALID_ARGUMENT}
CASES = [(name, item, expected) for name, protocol, item, expected in REFUSALS
         if protocol == "v2_binary" and isinstance(item, Item)]


@pytest.fixture(scope="module")
def grpc_server(tiny_bundle) -> Iterator[tuple[LiveServer, service_pb2_grpc.GRPCInferenceServiceStub]]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with run_live_server(Settings(preset="tiny", device="cpu", grpc_port=port), tiny_bundle) as live, \
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield live, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _message(item: Item, *, is_typed: bool) -> service_pb2.ModelInferRequest:
    """``item`` as tritonclient would send it (raw contents), or with typed contents."""
    message = service_pb2.ModelInferRequest(model_name="tiny")
    tensors: list[tuple[str, str, list[int], list]] = []  # (name, datatype, shape, elements)
    if item.text is not None or item.text_bytes is not None:
        tensors.append(("text", "BYTES", [1], [item.text_bytes if item.text_bytes is not None
                                               else item.text.encode()]))  # type: ignore[union-attr]
    if item.image is not None:
        tensors.append(("image", "BYTES", [1], [item.image]))
    if item.pixels is not None:
        shape, data = item.pixels
        tensors.append(("image_uint8", "UINT8", [1, *shape], list(data)))
    for name, datatype, shape, elements in tensors:
        tensor = message.inputs.add(name=name, datatype=datatype, shape=shape)
        if is_typed and datatype == "BYTES":
            tensor.contents.bytes_contents.extend(elements)
        elif is_typed:
            tensor.contents.uint_contents.extend(elements)
        elif datatype == "BYTES":
            message.raw_input_contents.append(b"".join(len(e).to_bytes(4, "little") + e for e in elements))
        else:
            message.raw_input_contents.append(bytes(elements))
    if item.truncate:
        message.parameters["truncate"].bool_param = True
    return message


def _counted(live: LiveServer, status: int) -> float:
    with live.client() as client:
        text = client.get("/metrics").text
    found = re.search(rf'^mmserve_requests_total\{{code="{status}",route="v2_grpc"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def _refused(live: LiveServer, stub: service_pb2_grpc.GRPCInferenceServiceStub, send: object, status: int,
             code: str) -> dict:
    before = _counted(live, status)
    with pytest.raises(grpc.RpcError) as raised:
        send()  # type: ignore[operator]
    assert raised.value.code() == GRPC_STATUS[status], raised.value.details()
    body = json.loads(raised.value.details())
    assert body["error"]["code"] == code, body
    assert _counted(live, status) == before + 1
    ordinary = stub.ModelInfer(_message(Item(text="an ordinary request"), is_typed=False), timeout=60)
    assert np.frombuffer(ordinary.raw_output_contents[0], np.float32).shape == (32,)
    return body


@pytest.mark.parametrize("is_typed", [False, True], ids=["raw", "typed"])
@pytest.mark.parametrize(("name", "item", "expected"), CASES, ids=[name for name, _, _ in CASES])
def test_bad_input_over_grpc_is_refused_as_over_http(grpc_server, name, item, expected, is_typed):
    live, stub = grpc_server
    status, code = expected
    _refused(live, stub, lambda: stub.ModelInfer(_message(item, is_typed=is_typed), timeout=60), status, code)


def test_the_grpc_matrix_covers_the_shared_kinds_of_bad_input():
    names = {name for name, _, _ in CASES}
    assert {"empty_text", "whitespace_text", "empty_image", "not_an_image", "truncated_png", "png_bomb",
            "gif_bomb", "text_over_the_token_limit", "pixels_wrong_channels", "pixels_zero_side"} <= names


def test_bytes_that_are_no_message_are_invalid_argument(grpc_server):
    live, stub = grpc_server
    settings = live.app.state.mmserve.settings
    with grpc.insecure_channel(f"{settings.host}:{settings.grpc_port}") as channel:
        raw_call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        body = _refused(live, stub, lambda: raw_call(b"\xff\xff\xff\xff", timeout=30), 400, "invalid_message")
    assert body["error"]["field"] == "message"


def test_raw_contents_that_do_not_match_the_inputs_are_invalid_argument(grpc_server):
    live, stub = grpc_server
    message = _message(Item(text="two inputs, one raw tensor", image=b"x"), is_typed=False)
    del message.raw_input_contents[1]
    body = _refused(live, stub, lambda: stub.ModelInfer(message, timeout=30), 400, "invalid_tensor_data")
    assert body["error"]["field"] == "raw_input_contents"


def test_a_raw_tensor_that_does_not_fill_its_shape_is_named_as_grpc_carries_it(grpc_server):
    """A gRPC message has no binary_data_size (the HTTP binary form's parameter): the error names the
    raw_input_contents entry that is short, as the client wrote it."""
    live, stub = grpc_server
    message = _message(Item(text="a dog", pixels=([8, 8, 3], bytes(192))), is_typed=False)
    message.raw_input_contents[1] = bytes(100)
    body = _refused(live, stub, lambda: stub.ModelInfer(message, timeout=30), 400, "invalid_tensor_data")
    assert body["error"]["field"] == "image_uint8", body
    assert "raw_input_contents[1] holds 100 bytes" in body["error"]["message"], body
    assert "binary_data_size" not in body["error"]["message"], body


def test_a_bad_image_is_named_by_the_v2_input_that_carried_it(grpc_server):
    """KServe v2 has the inputs image ([N, K]) and image_uint8; an error names those, not /v1/infer's
    images[k] and image.uint8 (which a ModelInferRequest cannot carry)."""
    live, stub = grpc_server
    message = service_pb2.ModelInferRequest(model_name="tiny")
    message.inputs.add(name="image", datatype="BYTES", shape=[1, 2]).contents.bytes_contents.extend(
        [encoded_image(1), b"not an image"])
    body = _refused(live, stub, lambda: stub.ModelInfer(message, timeout=30), 415, "unsupported_image_format")
    assert body["error"]["field"] == "image[1]" and "images[" not in body["error"]["message"], body
    zero_side = _message(Item(pixels=([0, 4, 3], b"")), is_typed=False)
    body = _refused(live, stub, lambda: stub.ModelInfer(zero_side, timeout=30), 422, "invalid_image_size")
    assert body["error"]["field"] == "image_uint8" and "image.uint8" not in body["error"]["message"], body


@pytest.mark.parametrize(("name", "value"), [("timeout", 0), ("priority", "urgent"), ("truncate", "yes")])
def test_a_bad_parameter_is_named_as_v2_names_it(grpc_server, name, value):
    """A refused request parameter is ``parameters.<name>``, as a 504's field is ``parameters.timeout``: one
    naming for a v2 client, not the bare key."""
    live, stub = grpc_server
    message = _message(Item(text="a dog"), is_typed=False)
    if isinstance(value, int):
        message.parameters[name].int64_param = value
    else:
        message.parameters[name].string_param = value
    body = _refused(live, stub, lambda: stub.ModelInfer(message, timeout=30), 400, "invalid_parameter")
    assert body["error"]["field"] == f"parameters.{name}", body


def test_a_row_of_padding_only_is_named_by_the_image_input_not_body(grpc_server):
    """A gRPC message has no body: an [N, K] row of empty elements with no text names the input ``image``."""
    live, stub = grpc_server
    message = service_pb2.ModelInferRequest(model_name="tiny")
    message.inputs.add(name="image", datatype="BYTES", shape=[2, 2]).contents.bytes_contents.extend(
        [encoded_image(1), b"", b"", b""])
    body = _refused(live, stub, lambda: stub.ModelInfer(message, timeout=30), 422, "empty_request")
    assert body["error"]["field"] == "image", body
    assert body["error"]["message"].startswith("row 1: image row 1 is only padding"), body
