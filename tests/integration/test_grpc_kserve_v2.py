"""KServe v2 over gRPC, live, with unmodified ``tritonclient.grpc``, whatever ``--api-workers N`` (1 and 2).

One ``mmserve serve --grpc-port`` per N for the module (keys, a body limit,
fault drills, the segment cache off so answers are bit-equal), asked over gRPC
and over the HTTP v2 route (``tritonclient.http``, binary) for the same inputs:

    health (grpc.health.v1 Check), ServerLive/Ready   no key
    health for an unknown service                     Check NOT_FOUND; Watch SERVICE_UNKNOWN, the call left open
    ModelReady of an unknown model or version         ready=false, status OK (as Triton and tritonclient.http)
    class_count / shared memory on an output          INVALID_ARGUMENT, the HTTP v2 route's 400 text
    ModelConfig                                       what the route takes (optional inputs, text [1] -> [],
                                                      max_batch_size = the per-request row limit, enforced),
                                                      equal to HTTP's /config; an unknown route under the
                                                      model is 404 route_not_found over HTTP
    text, BYTES image, image_uint8, text + image      outputs equal to the HTTP v2 route's, bit for bit
    ModelInfer without a key                          UNAUTHENTICATED, the HTTP JSON error text
    an inference key on an admin RPC                  PERMISSION_DENIED (an admin key: UNIMPLEMENTED)
    a bad image                                       INVALID_ARGUMENT naming it
    a message over the body limit                     RESOURCE_EXHAUSTED
    a call stalled past its gRPC deadline             DEADLINE_EXCEEDED; the server counts a 504 and its queue empties
    a stream of 50, one bad                           49 answers with their ids, one error_message, the stream open
    N = 2                                             each API process listens on the port (SO_REUSEPORT), 2 channels

The drain (health NOT_SERVING, new calls UNAVAILABLE, running ones finish) is
shown here on an in-process server, whose router drains as SIGTERM makes it,
and on a real process sent SIGTERM in test_grpc_guards_and_drain.py (with the
rate limit, the audit log and a client's cancel).
"""

from __future__ import annotations

import json
import queue
import re
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from router.faults import FaultPlan
from server.settings import Settings
from tests.conftest import run_live_server, run_serve_process
from tests.encoded_images import encoded_image

KEY = "inference-key-grpc-Pq7w"
ADMIN_KEY = "admin-key-grpc-Lm3z"
MAX_BODY_BYTES = 1_000_000
MODEL = "tiny"


def auth() -> dict[str, str]:
    """A new headers dict each call: tritonclient.http adds its own headers to the dict it is given."""
    return {"authorization": f"Bearer {KEY}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Served:
    url: str
    grpc_address: str
    grpc_port: int
    num_api_workers: int

    def grpc_client(self) -> triton_grpc.InferenceServerClient:
        return triton_grpc.InferenceServerClient(self.grpc_address)

    def http_client(self) -> triton_http.InferenceServerClient:
        return triton_http.InferenceServerClient(self.url.removeprefix("http://"), network_timeout=120)

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        wanted = "".join(f'(?=[^}}]*{key}="{value}")' for key, value in labels.items())
        total = 0.0
        for match in re.finditer(rf"^{name}\{{{wanted}[^}}]*\}} (\S+)$", text, re.M):
            total += float(match.group(1))
        return total


@pytest.fixture(scope="module", params=[1, 2], ids=["api-workers-1", "api-workers-2"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    grpc_port = free_port()
    env = {"MMSERVE_API_KEYS": KEY, "MMSERVE_ADMIN_API_KEYS": ADMIN_KEY, "MMSERVE_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
           "MMSERVE_CACHE_IMAGE_BYTES": "0", "MMSERVE_CACHE_TEXT_BYTES": "0",
           # A call's rows batch together even on a loaded machine: the bit-for-bit comparisons need the same
           # batches over both protocols (a text in a batch of 1 or of 2 differs by an ulp), and a full-suite run
           # once saw a two-text call split past the default 5 ms.
           "MMSERVE_MAX_QUEUE_DELAY_MS": "20"}
    args = ["--preset", "tiny", "--device", "cpu", "--api-workers", str(request.param), "--enable-fault-injection",
            "--grpc-port", str(grpc_port)]
    with run_serve_process(args, env, ready_timeout_s=300) as process:
        yield Served(process.url, f"127.0.0.1:{grpc_port}", grpc_port, request.param)


def _text_input(texts: list[bytes], module=triton_grpc):  # noqa: ANN001 - tritonclient.grpc or .http
    tensor = module.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object))
    return tensor


def _image_input(images: list[bytes], module=triton_grpc):  # noqa: ANN001
    tensor = module.InferInput("image", [len(images)], "BYTES")
    tensor.set_data_from_numpy(np.array(images, dtype=object))
    return tensor


def _pixels_input(pixels: np.ndarray, module=triton_grpc):  # noqa: ANN001
    tensor = module.InferInput("image_uint8", list(pixels.shape), "UINT8")
    tensor.set_data_from_numpy(pixels)
    return tensor


def _error(raised: pytest.ExceptionInfo) -> tuple[str, dict]:
    """tritonclient's status and the JSON error text the server sent."""
    error = raised.value
    return error.status(), json.loads(error.message())


CASES = {
    "text": lambda m: [_text_input([b"a photo of a cat", b"two dogs"], m)],
    "image": lambda m: [_image_input([encoded_image(1), encoded_image(2, fmt="JPEG")], m)],
    "image_uint8": lambda m: [_pixels_input(np.random.default_rng(3).integers(0, 256, (2, 40, 56, 3), np.uint8), m)],
    "fused": lambda m: [_text_input([b"a cat", b"a dog"], m), _image_input([encoded_image(4), encoded_image(5)], m)],
}


@pytest.mark.parametrize("case", CASES)
def test_outputs_equal_the_http_v2_routes_bit_for_bit(served: Served, case: str):
    with served.grpc_client() as grpc_client:
        over_grpc = grpc_client.infer(MODEL, CASES[case](triton_grpc), headers=auth(), request_id=f"grpc-{case}")
    over_http = served.http_client().infer(MODEL, CASES[case](triton_http), headers=auth())
    names = [output["name"] for output in over_http.get_response()["outputs"]]
    assert names == [output.name for output in over_grpc.get_response().outputs]
    assert over_grpc.get_response().id == f"grpc-{case}"
    for name in names:
        assert over_grpc.as_numpy(name).dtype == np.float32
        np.testing.assert_array_equal(over_grpc.as_numpy(name), over_http.as_numpy(name), err_msg=name)


def test_image_embeddings_keep_the_inputs_k_when_every_row_is_padded(served: Served):
    """README: an [N, K] image input gives image_embeddings [N, K, D], zeros for padding, whatever the rows
    hold; a client reshapes by the K it sent."""
    rows = np.array([[encoded_image(6), b"", b""], [encoded_image(7), encoded_image(8), b""]], dtype=object)
    answers = {}
    for module, client in ((triton_grpc, served.grpc_client()), (triton_http, served.http_client())):
        with client:
            images = module.InferInput("image", [2, 3], "BYTES")
            images.set_data_from_numpy(rows)
            answers[module.__name__] = client.infer(MODEL, [images], headers=auth()).as_numpy("image_embeddings")
    over_grpc, over_http = answers.values()
    assert over_grpc.shape[:2] == (2, 3) and over_http.shape[:2] == (2, 3), (over_grpc.shape, over_http.shape)
    assert not over_grpc[:, 2].any() and not over_grpc[0, 1].any() and over_grpc[1, 1].any()
    np.testing.assert_array_equal(over_grpc, over_http)


def test_health_and_liveness_need_no_key_and_metadata_matches_http(served: Served):
    with grpc.insecure_channel(served.grpc_address) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    with served.grpc_client() as client:
        assert client.is_server_live() and client.is_server_ready()
        with pytest.raises(InferenceServerException) as raised:
            client.get_model_metadata(MODEL)  # like GET /v2/models/tiny: an inference route
        assert raised.value.status() == "StatusCode.UNAUTHENTICATED"
        metadata = client.get_model_metadata(MODEL, headers=auth(), as_json=True)
        config = client.get_model_config(MODEL, headers=auth(), as_json=True)["config"]
    over_http = httpx.get(f"{served.url}/v2/models/{MODEL}", headers={"Authorization": f"Bearer {KEY}"}).json()
    for kind in ("inputs", "outputs"):
        assert [{**t, "shape": [int(d) for d in t["shape"]]} for t in metadata[kind]] == over_http[kind]
    assert [t["name"] for t in config["input"]] == [t["name"] for t in over_http["inputs"]]
    assert int(config["max_batch_size"]) >= 1


def test_model_ready_is_false_for_an_unknown_model_or_version_as_triton_answers(served: Served):
    with served.grpc_client() as client:
        assert client.is_model_ready(MODEL, headers=auth()) and client.is_model_ready(MODEL, "1", headers=auth())
        assert client.is_model_ready("nope", headers=auth()) is False
        assert client.is_model_ready(MODEL, "2", headers=auth()) is False
        with pytest.raises(InferenceServerException) as raised:
            client.is_model_ready("nope")  # still an inference call: the key comes first
        assert raised.value.status() == "StatusCode.UNAUTHENTICATED"
    assert served.http_client().is_model_ready("nope", headers=auth()) is False


def test_health_knows_its_services_check_refuses_an_unknown_one_and_watch_keeps_it_open(served: Served):
    serving, unknown = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    with grpc.insecure_channel(served.grpc_address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == serving
        with pytest.raises(grpc.RpcError) as raised:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        assert json.loads(raised.value.details())["error"]["field"] == "service"
        watch = health.Watch(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=2)
        assert next(watch).status == unknown
        with pytest.raises(grpc.RpcError) as raised:
            next(watch)  # the server keeps the call open: the client's deadline ends it
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        known = health.Watch(health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService"), timeout=10)
        assert next(known).status == serving
        known.cancel()


def _requested_output(module, how: str):  # noqa: ANN001, ANN202 - tritonclient.grpc or .http
    if how == "classification":
        return module.InferRequestedOutput("text_embedding", class_count=3)
    output = module.InferRequestedOutput("text_embedding")
    output.set_shared_memory("a-region", 128)
    return output


@pytest.mark.parametrize("how", ["classification", "shared_memory"])
def test_output_parameters_but_binary_data_are_refused_as_the_http_v2_route_refuses_them(served: Served, how: str):
    with served.grpc_client() as client, pytest.raises(InferenceServerException) as over_grpc:
        client.infer(MODEL, [_text_input([b"a cat"])], outputs=[_requested_output(triton_grpc, how)], headers=auth())
    with pytest.raises(InferenceServerException) as over_http:
        served.http_client().infer(MODEL, [_text_input([b"a cat"], triton_http)],
                                   outputs=[_requested_output(triton_http, how)], headers=auth())
    status, body = _error(over_grpc)
    assert status == "StatusCode.INVALID_ARGUMENT" and over_http.value.status() == "400"
    assert body["error"] == {"code": "unsupported_parameter", "field": "text_embedding",
                             "message": "output text_embedding: only binary_data is supported among output parameters"}
    assert over_http.value.message() == f"{body['error']['code']}: {body['error']['message']}"


def test_model_config_describes_what_the_v2_route_takes_and_http_serves_the_same(served: Served):
    with served.grpc_client() as client:
        over_grpc = client.get_model_config(MODEL, headers=auth(), as_json=True)["config"]
    over_http = served.http_client().get_model_config(MODEL, headers=auth())
    bearer = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{served.url}/v2/models/{MODEL}/versions/1/config", headers=bearer).json() == over_http
    assert httpx.get(f"{served.url}/v2/models/{MODEL}/config").status_code == 401  # guarded like metadata
    # one description: the HTTP JSON read as Triton's message is the gRPC answer
    assert json_format.ParseDict(over_http, model_config_pb2.ModelConfig()) == \
        json_format.ParseDict(over_grpc, model_config_pb2.ModelConfig())
    inputs = {tensor["name"]: tensor for tensor in over_http["input"]}
    assert all(tensor["optional"] is True for tensor in inputs.values())
    assert inputs["text"]["dims"] == [1] and inputs["text"]["reshape"] == {"shape": []}  # [N, 1] -> [N]
    assert inputs["image"]["dims"] == [-1] and inputs["image_uint8"]["dims"] == [-1, -1, 3]
    # max_batch_size is the most rows one request may carry: every lane's queue bound (Settings' default)
    max_batch_size = over_http["max_batch_size"]
    assert max_batch_size == Settings.model_fields["max_queue_size"].default
    with served.grpc_client() as client:
        rows = [f"row {index}".encode() for index in range(max_batch_size)]
        answer = client.infer(MODEL, [_text_input(rows)], headers=auth(), client_timeout=120)
        assert answer.as_numpy("text_embedding").shape == (max_batch_size, 32)
        with pytest.raises(InferenceServerException) as raised:
            client.infer(MODEL, [_text_input([*rows, b"one too many"])], headers=auth())
    status, body = _error(raised)
    assert status == "StatusCode.RESOURCE_EXHAUSTED" and body["error"]["code"] == "too_many_rows", body


def test_http_names_an_unknown_route_under_a_served_model_instead_of_an_unknown_model(served: Served):
    bearer = {"Authorization": f"Bearer {KEY}"}
    unknown_route = httpx.get(f"{served.url}/v2/models/{MODEL}/nonsense", headers=bearer)
    assert unknown_route.status_code == 404
    assert unknown_route.json()["error"].startswith("route_not_found: ") and "nonsense" in unknown_route.text
    under_ready = httpx.get(f"{served.url}/v2/models/{MODEL}/nonsense/ready", headers=bearer)
    assert under_ready.status_code == 404 and under_ready.json()["error"].startswith("route_not_found: ")
    unknown_model = httpx.get(f"{served.url}/v2/models/nope/config", headers=bearer)
    assert unknown_model.status_code == 404 and unknown_model.json()["error"].startswith("model_not_found: ")


def test_a_keyless_inference_call_is_unauthenticated_with_the_http_error_text(served: Served):
    before = served.metric("mmserve_requests_total", route="v2_grpc", code="401")
    with served.grpc_client() as client, pytest.raises(InferenceServerException) as raised:
        client.infer(MODEL, [_text_input([b"hello"])])
    status, body = _error(raised)
    assert status == "StatusCode.UNAUTHENTICATED"
    assert body == {"error": {"code": "missing_api_key", "field": "authorization",
                              "message": "this server needs an API key: send Authorization: Bearer <key>"}}
    assert served.metric("mmserve_requests_total", route="v2_grpc", code="401") == before + 1


def test_tritonclient_http_reads_the_guards_refusals_as_triton_words_them(served: Served):
    """The key check and the body limit answer before the v2 route runs; on /v2 paths they answer in Triton's
    shape ({"error": "<code>: <message>"}), which tritonclient.http turns into its exception's text (an
    mmserve-shaped object there made formatting the exception raise TypeError). Routing's 404 and 405 too."""
    with served.http_client() as client:
        with pytest.raises(InferenceServerException) as keyless:
            client.infer(MODEL, [_text_input([b"hello"], triton_http)])
        pixels = np.zeros((1, 600, 600, 3), np.uint8)  # 1.08 MB > MAX_BODY_BYTES
        with pytest.raises(InferenceServerException) as too_large:
            client.infer(MODEL, [_pixels_input(pixels, triton_http)], headers=auth())
    assert str(keyless.value) == ("[401] missing_api_key: this server needs an API key: send Authorization: "
                                  "Bearer <key>"), str(keyless.value)
    assert str(too_large.value).startswith("[413] body_too_large: request body exceeds the limit of "), too_large.value
    unknown = httpx.post(f"{served.url}/v2/repository/index", headers=auth(), timeout=30)
    wrong_method = httpx.delete(f"{served.url}/v2/models/{MODEL}/infer", headers=auth(), timeout=30)
    native = httpx.get(f"{served.url}/v1/no-such-route", headers=auth(), timeout=30)
    assert (unknown.status_code, unknown.json()["error"].split(":")[0]) == (404, "route_not_found"), unknown.text
    assert (wrong_method.status_code, wrong_method.json()["error"].split(":")[0]) == (405, "method_not_allowed")
    assert (native.status_code, native.json()["error"]["code"]) == (404, "route_not_found"), native.text


def test_an_inference_key_on_an_admin_rpc_is_permission_denied(served: Served):
    with served.grpc_client() as client:
        with pytest.raises(InferenceServerException) as raised:
            client.load_model(MODEL, headers=auth())
        assert _error(raised)[0] == "StatusCode.PERMISSION_DENIED"
        with pytest.raises(InferenceServerException) as raised:
            client.load_model(MODEL, headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert raised.value.status() == "StatusCode.UNIMPLEMENTED" and "RepositoryModelLoad" in raised.value.message()


def test_a_bad_image_is_invalid_argument_naming_it(served: Served):
    with served.grpc_client() as client, pytest.raises(InferenceServerException) as raised:
        client.infer(MODEL, [_image_input([encoded_image(1), b"not an image at all"])], headers=auth())
    status, body = _error(raised)
    assert status == "StatusCode.INVALID_ARGUMENT"
    assert body["error"]["field"].startswith("image") and body["error"]["message"].startswith("row 1: "), body


def test_errors_name_the_v2_parameters_a_triton_client_sets(served: Served):
    """A text over the token limit is told to set parameters.truncate, as the HTTP v2 route tells it, not the
    native route's "truncate": true, which a ModelInferRequest cannot carry."""
    too_long = b"x" * 600
    with served.grpc_client() as client, pytest.raises(InferenceServerException) as raised:
        client.infer(MODEL, [_text_input([too_long])], headers=auth())
    status, body = _error(raised)
    with served.http_client() as http_client, pytest.raises(InferenceServerException) as http_raised:
        http_client.infer(MODEL, [_text_input([too_long], triton_http)], headers=auth())
    assert status == "StatusCode.INVALID_ARGUMENT"
    assert body["error"]["code"] == "text_too_long"
    assert "parameters.truncate" in body["error"]["message"] and '"truncate": true' not in body["error"]["message"]
    assert body["error"]["message"].removeprefix("row 0: ") in http_raised.value.message(), http_raised.value.message()


def test_the_calls_deadline_neither_hides_a_bad_timeout_parameter_nor_is_refused_as_one(served: Served):
    """tritonclient's ``timeout`` (parameters.timeout, µs) and ``client_timeout`` (the gRPC deadline, s) are two
    settings. A timeout the HTTP v2 route refuses is refused whether or not the call has a deadline; a deadline
    longer than the longest timeout (an hour) is no parameter the client sent, so the call is answered."""
    with served.grpc_client() as client, served.http_client() as http_client:
        for timeout_us in (0, 3_600_000_001):
            with pytest.raises(InferenceServerException) as http_raised:
                http_client.infer(MODEL, [_text_input([b"a dog"], triton_http)], timeout=timeout_us, headers=auth())
            for deadline_s in (None, 30.0):
                with pytest.raises(InferenceServerException) as raised:
                    client.infer(MODEL, [_text_input([b"a dog"])], timeout=timeout_us, client_timeout=deadline_s,
                                 headers=auth())
                status, body = _error(raised)
                assert status == "StatusCode.INVALID_ARGUMENT", (timeout_us, deadline_s, status)
                assert (body["error"]["code"], body["error"]["field"]) == ("invalid_parameter",
                                                                          "parameters.timeout"), body
                assert body["error"]["message"] in http_raised.value.message(), http_raised.value.message()
        answer = client.infer(MODEL, [_text_input([b"a dog"])], client_timeout=7200.0, headers=auth())
        assert answer.as_numpy("text_embedding").shape[0] == 1


def test_a_message_over_the_body_limit_is_resource_exhausted(served: Served):
    pixels = np.zeros((1, 600, 600, 3), np.uint8)  # 1.08 MB > MAX_BODY_BYTES
    with served.grpc_client() as client, pytest.raises(InferenceServerException) as raised:
        client.infer(MODEL, [_pixels_input(pixels)], headers=auth())
    assert raised.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_a_call_stalled_past_its_deadline_is_given_up_by_the_server(served: Served):
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    before = served.metric("mmserve_requests_total", route="v2_grpc", code="504")
    drill = httpx.post(f"{served.url}/v1/admin/faults", headers=admin,
                       json={"stage": "text", "delay_ms": 3000, "fraction": 1.0, "duration_s": 3})
    assert drill.status_code == 200, drill.text
    try:
        with served.grpc_client() as client, ThreadPoolExecutor(2) as pool:
            # the first text batch holds the compute thread for 3 s; the second waits in the queue
            first = pool.submit(client.infer, MODEL, [_text_input([b"stalled"])], headers=auth(), client_timeout=10)
            time.sleep(0.3)
            with pytest.raises(InferenceServerException) as raised:
                client.infer(MODEL, [_text_input([b"waits past its deadline"])], headers=auth(), client_timeout=1.0)
            assert raised.value.status() == "StatusCode.DEADLINE_EXCEEDED"
            first.result()
    finally:
        httpx.delete(f"{served.url}/v1/admin/faults", headers=admin)
    deadline = time.monotonic() + 20
    while served.metric("mmserve_requests_total", route="v2_grpc", code="504") < before + 1:
        assert time.monotonic() < deadline, "the server never counted the given-up call as 504"
        time.sleep(0.2)
    # The engine's gauge (polled into /metrics with API processes) drops once the cancelled item leaves the queue.
    while served.metric("mmserve_queue_depth", lane="text") != 0:
        assert time.monotonic() < deadline, "the given-up call stayed in the text queue"
        time.sleep(0.2)


def test_a_stream_of_50_answers_each_with_its_id_and_one_error_message(served: Served):
    answers: queue.Queue = queue.Queue()
    with served.grpc_client() as client:
        client.start_stream(lambda result, error: answers.put((result, error)), headers=auth())
        for index in range(50):
            inputs = ([_image_input([b"broken"])] if index == 17
                      else [_text_input([f"text number {index}".encode()])])
            client.async_stream_infer(MODEL, inputs, request_id=str(index))
        received = [answers.get(timeout=120) for _ in range(50)]
        # the stream stayed open after the error: one more request is answered
        client.async_stream_infer(MODEL, [_text_input([b"after"])], request_id="after")
        late, late_error = answers.get(timeout=60)
        client.stop_stream()
    assert late_error is None and late.get_response().id == "after"
    errors = [error for result, error in received if error is not None]
    assert len(errors) == 1 and json.loads(errors[0].message())["error"]["field"].startswith("image")
    ids = sorted(int(result.get_response().id) for result, error in received if error is None)
    assert ids == [index for index in range(50) if index != 17]
    assert all(result.as_numpy("text_embedding").shape == (1, 32) for result, error in received if error is None)


def _listening_sockets(port: int) -> int:
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                    count += 1
    return count


def test_every_api_process_listens_on_the_grpc_port_and_channels_are_answered(served: Served):
    assert _listening_sockets(served.grpc_port) == served.num_api_workers
    timed_before = served.metric("mmserve_request_duration_seconds_count", route="v2_grpc")
    clients = [served.grpc_client() for _ in range(4)]
    try:
        embeddings = [client.infer(MODEL, [_text_input([b"same text"])], headers=auth()).as_numpy("text_embedding")
                      for client in clients]
    finally:
        for client in clients:
            client.close()
    for embedding in embeddings[1:]:
        np.testing.assert_array_equal(embedding, embeddings[0])
    assert served.metric("mmserve_request_duration_seconds_count", route="v2_grpc") == timed_before + 4


def test_gzip_and_keepalive_are_accepted(served: Served):
    keepalive = triton_grpc.KeepAliveOptions(keepalive_time_ms=10_000, keepalive_timeout_ms=5_000,
                                             keepalive_permit_without_calls=True)
    with triton_grpc.InferenceServerClient(served.grpc_address, keepalive_options=keepalive) as client:
        answer = client.infer(MODEL, [_text_input([b"compressed"])], headers=auth(), compression_algorithm="gzip")
    assert answer.as_numpy("text_embedding").shape == (1, 32)


def test_draining_turns_health_not_serving_refuses_new_calls_and_finishes_running_ones(tiny_bundle):
    port = free_port()
    settings = Settings(preset="tiny", device="cpu", grpc_port=port, enable_fault_injection=True)
    with run_live_server(settings, tiny_bundle) as live:
        state = live.app.state.mmserve
        state.faults.activate(FaultPlan(stage="text", delay_ms=1500, fraction=1.0, duration_s=5))
        with triton_grpc.InferenceServerClient(f"127.0.0.1:{port}") as client, ThreadPoolExecutor(1) as pool:
            running = pool.submit(client.infer, MODEL, [_text_input([b"running"])], client_timeout=30)
            time.sleep(0.5)
            state.router.begin_drain()  # what SIGTERM does first (server.runtime.lifecycle)
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(InferenceServerException) as raised:
                client.infer(MODEL, [_text_input([b"new"])])
            assert raised.value.status() == "StatusCode.UNAVAILABLE"
            assert "shutting down" in json.loads(raised.value.message())["error"]["message"]
            assert running.result().as_numpy("text_embedding").shape == (1, 32)


def test_the_readme_grpc_example_runs_as_written(tiny_bundle):
    """README's tritonclient.grpc example, with its address and model made this server's (a free port, not
    8001; the tiny preset, not vit-l16): the rest as written."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    (example,) = re.findall(r"```python\n( *import numpy as np, tritonclient\.grpc as grpcclient\n.*?) *```", readme,
                            re.S)
    example = textwrap.dedent(example)
    port = free_port()
    example = example.replace("localhost:8001", f"127.0.0.1:{port}").replace('"vit-l16"', '"tiny"')
    with run_live_server(Settings(preset="tiny", device="cpu", grpc_port=port), tiny_bundle):
        completed = subprocess.run([sys.executable, "-c", example],
                                   capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "(1, 32)"
