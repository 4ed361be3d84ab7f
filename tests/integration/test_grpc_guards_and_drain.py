"""gRPC's guards and lifecycle, live: the rate limit, the audit log, a client's cancel, and SIGTERM's drain.

One in-process server (keys, a rate limit, ``--grpc-port``) for the first three:

    429 over gRPC            RESOURCE_EXHAUSTED, ``retry-after`` and ``grpc-retry-pushback-ms`` in the trailing
                             metadata, HTTP's 429 JSON text; one bucket per key for HTTP and gRPC together
    429 on a stream          a stream of N requests spends N tokens (opening it spends none); the refused
                             request's answer carries its id and the 429 JSON text in ``error_message``
    admin RPCs               one audit line each (``mmserve.audit``), as an HTTP admin route writes
    a client cancels         the call leaves the text queue while the stalled batch still runs, counted 499

and a real ``mmserve serve --grpc-port`` process for the drain: SIGTERM while a
call runs turns health NOT_SERVING, a new call UNAVAILABLE, the running call
gets its answer, and the process exits 0.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest
import tritonclient.grpc as triton_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from router.faults import FaultPlan
from server.settings import Settings
from tests.conftest import LiveServer, run_live_server, run_serve_process
from tests.integration.test_grpc_kserve_v2 import _text_input, free_port

MODEL = "tiny"
KEY = "inference-key-guards-Wx4k"  # the cancel test's
LIMITED_KEY = "inference-key-limited-Ht8v"  # the rate-limit test's: its bucket is spent on purpose
STREAM_KEY = "inference-key-stream-Qd5n"  # the stream's rate-limit test's: BURST requests, then one too many
ADMIN_KEY = "admin-key-guards-Zr2q"
BURST = 8  # KEY and ADMIN_KEY spend 3 and 1 of theirs; LIMITED_KEY spends all of its own
RATE_LIMIT = f"0.001/s,burst={BURST}"  # a spent bucket stays spent for the test's life
SERVICE = "inference.GRPCInferenceService"


def _key_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    wanted = "".join(f'(?=[^}}]*{key}="{value}")' for key, value in labels.items())
    return sum(float(match.group(1)) for match in re.finditer(rf"^{name}\{{{wanted}[^}}]*\}} (\S+)$", text, re.M))


class Guarded:
    def __init__(self, live: LiveServer, grpc_port: int) -> None:
        self.live = live
        self.url = live.url
        self.grpc_address = f"127.0.0.1:{grpc_port}"


@pytest.fixture(scope="module")
def guarded(tiny_bundle) -> Iterator[Guarded]:
    port = free_port()
    settings = Settings(preset="tiny", device="cpu", grpc_port=port, enable_fault_injection=True,
                        api_keys=f"{KEY},{LIMITED_KEY},{STREAM_KEY}", admin_api_keys=ADMIN_KEY, rate_limit=RATE_LIMIT)
    with run_live_server(settings, tiny_bundle) as live:
        yield Guarded(live, port)


def _model_metadata(channel: grpc.Channel, key: str) -> service_pb2.ModelMetadataResponse:
    call = channel.unary_unary(f"/{SERVICE}/ModelMetadata",
                               request_serializer=service_pb2.ModelMetadataRequest.SerializeToString,
                               response_deserializer=service_pb2.ModelMetadataResponse.FromString)
    return call(service_pb2.ModelMetadataRequest(name=MODEL), metadata=tuple(_bearer(key).items()), timeout=30)


def test_over_the_rate_limit_grpc_is_resource_exhausted_and_shares_http_bucket(guarded: Guarded):
    with grpc.insecure_channel(guarded.grpc_address) as channel, httpx.Client(base_url=guarded.url) as client:
        # half the burst over HTTP, half over gRPC: one bucket, whichever protocol spends it
        for _ in range(BURST // 2):
            assert client.get(f"/v2/models/{MODEL}", headers=_bearer(LIMITED_KEY)).status_code == 200
        for _ in range(BURST - BURST // 2):
            assert _model_metadata(channel, LIMITED_KEY).name == MODEL
        with pytest.raises(grpc.RpcError) as raised:
            _model_metadata(channel, LIMITED_KEY)
        over_http = client.get(f"/v2/models/{MODEL}", headers=_bearer(LIMITED_KEY))
    error = raised.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert over_http.status_code == 429
    # One refusal, each protocol's shape: gRPC's details are mmserve's JSON error, HTTP /v2 Triton's string.
    refused = json.loads(error.details())["error"]
    assert refused["code"] == "rate_limited"
    assert over_http.json() == {"error": f"{refused['code']}: {refused['message']}"}
    trailing = dict(error.trailing_metadata())
    assert trailing["retry-after"] == over_http.headers["retry-after"]
    assert int(trailing["grpc-retry-pushback-ms"]) == int(over_http.headers["retry-after"]) * 1000 >= 1000
    assert _metric(guarded.url, "mmserve_rate_limited_total", key_id=_key_id(LIMITED_KEY)) == 2


def test_a_stream_spends_one_token_per_request_and_a_refused_one_is_answered_with_its_id(guarded: Guarded):
    def requests() -> Iterator[service_pb2.ModelInferRequest]:
        for index in range(BURST + 1):
            message = service_pb2.ModelInferRequest(model_name=MODEL, id=f"request-{index}")
            message.inputs.add(name="text", datatype="BYTES", shape=[1])
            text = f"text {index}".encode()
            message.raw_input_contents.append(len(text).to_bytes(4, "little") + text)
            yield message

    with grpc.insecure_channel(guarded.grpc_address) as channel:
        answers = list(service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
            requests(), metadata=tuple(_bearer(STREAM_KEY).items()), timeout=120))
    assert len(answers) == BURST + 1
    refused = [answer for answer in answers if answer.error_message]
    assert len(refused) == 1, [answer.error_message for answer in refused]  # the bucket held BURST: one too many
    assert json.loads(refused[0].error_message)["error"]["code"] == "rate_limited"
    served_ids = {answer.infer_response.id for answer in answers if not answer.error_message}
    sent_ids = {f"request-{index}" for index in range(BURST + 1)}
    assert refused[0].infer_response.id in sent_ids - served_ids
    assert served_ids | {refused[0].infer_response.id} == sent_ids


def test_admin_rpcs_are_written_to_the_audit_log(guarded: Guarded, caplog: pytest.LogCaptureFixture):
    callers = [(ADMIN_KEY, "StatusCode.UNIMPLEMENTED", _key_id(ADMIN_KEY), 501),
               (KEY, "StatusCode.PERMISSION_DENIED", _key_id(KEY), 403),
               (None, "StatusCode.UNAUTHENTICATED", "none", 401),
               ("not-a-configured-key", "StatusCode.UNAUTHENTICATED", "invalid", 401)]
    with caplog.at_level(logging.INFO, logger="mmserve.audit"), \
            triton_grpc.InferenceServerClient(guarded.grpc_address) as client:
        for key, status, _, _ in callers:
            with pytest.raises(InferenceServerException) as raised:
                client.load_model(MODEL, headers=_bearer(key) if key else None)
            assert raised.value.status() == status
        client.get_model_metadata(MODEL, headers=_bearer(KEY))  # an inference call: no audit line
    audit = [record.getMessage() for record in caplog.records if record.name == "mmserve.audit"]
    assert len(audit) == len(callers), audit
    stamp = r"time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    for line, (_, _, key_id, outcome) in zip(audit, callers, strict=True):
        assert re.fullmatch(rf"audit key_id={key_id} route=gRPC {SERVICE}/RepositoryModelLoad outcome={outcome} "
                            rf"{stamp} client=127\.0\.0\.1", line), line


def test_a_call_the_client_cancels_leaves_the_queue_counted_499(guarded: Guarded):
    state = guarded.live.app.state.mmserve
    url = guarded.url
    before = _metric(url, "mmserve_requests_total", route="v2_grpc", code="499")
    rows_before = _metric(url, "mmserve_batch_size_sum", lane="text")
    answers: dict[str, queue.Queue] = {"stalled": queue.Queue(), "cancelled": queue.Queue()}
    state.faults.activate(FaultPlan(stage="text", delay_ms=6000, fraction=1.0, duration_s=6))
    try:
        with triton_grpc.InferenceServerClient(guarded.grpc_address) as client:
            def start(name: str) -> object:
                return client.async_infer(MODEL, [_text_input([name.encode()])], headers=_bearer(KEY),
                                          callback=lambda result, error: answers[name].put((result, error)),
                                          client_timeout=60)
            start("stalled")  # its batch holds the compute thread for 6 s
            time.sleep(0.5)
            call = start("cancelled")
            deadline = time.monotonic() + 4
            while _metric(url, "mmserve_queue_depth", lane="text") != 1:  # the stalled batch runs, this one waits
                assert time.monotonic() < deadline, "the second call never waited in the text queue"
                time.sleep(0.05)
            call.cancel()
            while _metric(url, "mmserve_requests_total", route="v2_grpc", code="499") < before + 1:
                assert time.monotonic() < deadline, "the server never counted the cancelled call as 499"
                time.sleep(0.05)
            assert answers["stalled"].empty()  # counted while the stall runs: the cancel, not the deadline path
            _, error = answers["cancelled"].get(timeout=10)
            assert error is not None and "CANCELLED" in error.status()
            result, error = answers["stalled"].get(timeout=60)
            assert error is None and result.as_numpy("text_embedding").shape == (1, 32)
        # Once the compute thread is free the scheduler drops the cancelled entry (router.policy), as it drops a
        # dropped HTTP connection's: the queue empties and only the stalled request ran.
        deadline = time.monotonic() + 10
        while _metric(url, "mmserve_queue_depth", lane="text") != 0:
            assert time.monotonic() < deadline, "the cancelled call stayed in the text queue"
            time.sleep(0.05)
        assert _metric(url, "mmserve_batch_size_sum", lane="text") == rows_before + 1
        assert _metric(url, "mmserve_requests_total", route="v2_grpc", code="499") == before + 1
    finally:
        state.faults.clear()


def test_sigterm_drains_grpc_then_the_process_exits_0():
    port = free_port()
    env = {"MMSERVE_ADMIN_API_KEYS": ADMIN_KEY}
    args = ["--preset", "tiny", "--device", "cpu", "--api-workers", "1", "--enable-fault-injection",
            "--grpc-port", str(port)]
    with run_serve_process(args, env, ready_timeout_s=300) as served:
        drill = httpx.post(f"{served.url}/v1/admin/faults", headers=_bearer(ADMIN_KEY),
                           json={"stage": "text", "delay_ms": 5000, "fraction": 1.0, "duration_s": 5})
        assert drill.status_code == 200, drill.text
        with triton_grpc.InferenceServerClient(f"127.0.0.1:{port}") as client, ThreadPoolExecutor(1) as pool, \
                grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            running = pool.submit(client.infer, MODEL, [_text_input([b"running"])], client_timeout=60)
            time.sleep(0.5)
            served.process.send_signal(signal.SIGTERM)
            health = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 4
            while health.Check(health_pb2.HealthCheckRequest(), timeout=10).status != \
                    health_pb2.HealthCheckResponse.NOT_SERVING:
                assert time.monotonic() < deadline, "health never turned NOT_SERVING after SIGTERM"
                time.sleep(0.05)
            assert not running.done()
            with pytest.raises(InferenceServerException) as raised:
                client.infer(MODEL, [_text_input([b"new"])])
            assert raised.value.status() == "StatusCode.UNAVAILABLE"
            refusal = json.loads(raised.value.message())["error"]
            # No row named ("row 0: ..."): the refusal is the server's, not its first item's.
            assert (refusal["code"], refusal["message"]) == ("shutting_down", "the server is shutting down")
            assert running.result(timeout=60).as_numpy("text_embedding").shape == (1, 32)
        assert served.process.wait(timeout=120) == 0, served.process.stdout.read()
