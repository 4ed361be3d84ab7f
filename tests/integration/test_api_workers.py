"""``mmserve serve --api-workers 2`` as its own process tree: answers, errors and the cache as one process.

Each case runs against a server with two API processes and one engine, and
compares with a single-process server of the same model where the answer is
a number (embeddings must be equal: the pixels crossed through shared memory).
"""

from __future__ import annotations

import base64
import os
import re
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton_http

from encoded_images import b64, encoded_image
from tests.conftest import run_serve_processes
from tests.integration.same_answers import assert_same
from tests.integration.work_logs import send_until_both_api_processes_worked

TINY = ["--preset", "tiny", "--device", "cpu"]
HOOKS = str(Path(__file__).parent / "api_workers_hooks")


def children_of(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.fixture(scope="module")
def decode_log(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("decodes") / "decodes.log"


@pytest.fixture(scope="module")
def servers(decode_log):
    """The ``--api-workers 2`` server and the one-process server, started side by side."""
    env = {"PYTHONPATH": os.pathsep.join([HOOKS, os.environ.get("PYTHONPATH", "")]),
           "MMSERVE_TEST_DECODE_LOG": str(decode_log)}
    with run_serve_processes([([*TINY, "--api-workers", "2"], env), (TINY, None)]) as both:
        yield both


@pytest.fixture(scope="module")
def workers(servers):
    return servers[0]


@pytest.fixture(scope="module")
def single(servers):
    return servers[1]


def jpeg(seed: int, size=(320, 240)) -> bytes:
    return encoded_image(seed, size, "JPEG")


def infer(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/infer", json=body, timeout=60)


def command_line(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def test_two_api_processes_and_an_engine_run_under_the_supervisor(workers):
    children = children_of(workers.process.pid)
    assert len(children) == 4  # the engine, the API processes' fork server and two API processes
    assert sorted(sum(kind in command_line(pid) for pid in children)
                  for kind in (b"engine_process", b"api_forkserver", b"api_process")) == [1, 1, 2]
    answering = set()
    for _ in range(40):  # keep-alive off: each request a new connection, accepted by either process
        answering.add(httpx.get(f"{workers.url}/health/ready", headers={"Connection": "close"}).status_code)
    assert answering == {200}


def test_native_json_answers_equal_the_single_process(workers, single):
    for body in ({"text": "a red bicycle"}, {"image": {"b64": b64(jpeg(1))}},
                 {"image": {"b64": b64(jpeg(2))}, "text": "a photo", "use_cache": False},
                 {"images": [{"b64": b64(jpeg(3))}, {"b64": b64(jpeg(4))}], "text": "two"}):
        ours, theirs = infer(workers.url, body), infer(single.url, body)
        assert ours.status_code == theirs.status_code == 200, ours.text
        ours_json, theirs_json = ours.json(), theirs.json()
        assert ours_json["route"] == theirs_json["route"]
        assert ours_json["model"] == theirs_json["model"]
        for name in ("image_embedding", "image_embeddings", "text_embedding", "fused_embedding"):
            assert (name in ours_json) == (name in theirs_json)
            if name in ours_json:
                np.testing.assert_allclose(ours_json[name], theirs_json[name], rtol=1e-5, atol=1e-6)
        assert ours.headers["x-request-id"] == ours_json["id"]


def test_raw_uint8_pixels_answer_as_the_single_process(workers, single):
    pixels = np.random.default_rng(5).integers(0, 256, (40, 60, 3), dtype=np.uint8)
    body = {"image": {"uint8": {"shape": [40, 60, 3], "b64": base64.b64encode(pixels.tobytes()).decode()}}}
    ours, theirs = infer(workers.url, body), infer(single.url, body)
    assert ours.status_code == theirs.status_code == 200, ours.text
    np.testing.assert_allclose(ours.json()["image_embedding"], theirs.json()["image_embedding"], rtol=1e-5, atol=1e-6)


def test_multipart_upload(workers, single):
    files = {"image": ("cat.jpg", jpeg(6), "image/jpeg")}
    ours = httpx.post(f"{workers.url}/v1/infer", files=files, data={"text": "a cat"}, timeout=60)
    theirs = httpx.post(f"{single.url}/v1/infer", files=files, data={"text": "a cat"}, timeout=60)
    assert ours.status_code == theirs.status_code == 200, ours.text
    np.testing.assert_allclose(ours.json()["fused_embedding"], theirs.json()["fused_embedding"], rtol=1e-5, atol=1e-6)


def test_openai_embeddings_through_the_openai_client(workers, single):
    inputs = ["a red bicycle", "data:image/jpeg;base64," + b64(jpeg(7))]
    answers = []
    for served in (workers, single):
        with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0) as client:
            answers.append(client.embeddings.create(model="tiny", input=inputs))
    ours, theirs = answers
    assert [item.index for item in ours.data] == [0, 1]
    for mine, reference in zip(ours.data, theirs.data):
        np.testing.assert_allclose(mine.embedding, reference.embedding, rtol=1e-5, atol=1e-6)
    with openai.OpenAI(base_url=f"{workers.url}/v1", api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model="tiny", input=["fine", "data:image/png;base64,not base64!"])
    assert refused.value.status_code == 400


def test_kserve_v2_through_tritonclient(workers, single):
    outputs = []
    for served in (workers, single):
        client = triton_http.InferenceServerClient(served.url.removeprefix("http://"))
        assert client.is_server_ready() and client.is_model_ready("tiny")
        tensor = triton_http.InferInput("text", [2], "BYTES")
        tensor.set_data_from_numpy(np.array([b"a red bicycle", b"a blue car"], dtype=object), binary_data=True)
        result = client.infer("tiny", [tensor])
        outputs.append(result.as_numpy("text_embedding"))
        client.close()
    assert outputs[0].shape[0] == 2
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("body", [
    {"image": {"b64": b64(b"not an image at all")}},
    {"image": {"b64": "%%%"}},
    {"text": "x" * 100_001},
    {"images": [{"b64": b64(encoded_image(9, (32, 32), "PNG"))}] * 5},
    {"images": [{"b64": b64(encoded_image(9, (32, 32), "PNG"))}, {"b64": b64(b"broken")}]},
    {},
])
def test_bad_input_gets_the_single_process_error(workers, single, body):
    ours, theirs = infer(workers.url, body), infer(single.url, body)
    assert ours.status_code == theirs.status_code
    assert 400 <= ours.status_code < 500
    assert ours.json() == theirs.json()


@pytest.mark.parametrize("protocol", ["native", "v2"])
def test_a_deadline_shorter_than_the_compute_time_is_504_in_both_layouts(workers, single, protocol):
    """1 ms cannot hold the text lane's own compute time, even on an idle server: 504 naming the protocol's
    timeout field in one process and with API processes alike (the deadline may also pass on the way to the
    engine: the same answer), never 503, which says a retry later could help."""
    answers = {}
    rejected_before = {served.url: rejected_total(served.url) for served in (single, workers)}
    for served in (single, workers):
        for attempt in range(4):  # a new text each time: a cached text would need no compute at all
            text = f"{protocol} {served.url} {attempt} must be computed"
            if protocol == "native":
                response = infer(served.url, {"text": text, "timeout_ms": 1})
                error = response.json()["error"]
                answers[served.url, attempt] = (response.status_code, error["code"], error["field"],
                                                "timeout_ms" in error["message"])
            else:
                body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}],
                        "parameters": {"timeout": 1}}  # microseconds, Triton's unit: rounded up to 1 ms
                response = httpx.post(f"{served.url}/v2/models/tiny/infer", json=body, timeout=60)
                error = response.json()["error"]
                answers[served.url, attempt] = (response.status_code, error.split(":", 1)[0],
                                                "parameters.timeout" in error)
            assert "Retry-After" not in response.headers
    expected = (504, "deadline_exceeded", "timeout_ms", True) if protocol == "native" else \
        (504, "deadline_exceeded", True)
    assert set(answers.values()) == {expected}, answers
    for served in (single, workers):  # not load shedding: the shedding alert's counter stays put
        assert rejected_total(served.url) == rejected_before[served.url]


def rejected_total(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=60).text
    return sum(float(value) for value in re.findall(r"^mmserve_rejected_total\{[^}]*\} (\S+)$", text, re.M))


def test_a_body_over_the_limit_is_refused_the_same(workers, single):
    body = b"{" + b" " * (16 * 1024 * 1024 + 10) + b"}"
    answers = [httpx.post(f"{served.url}/v1/infer", content=body, headers={"content-type": "application/json"},
                          timeout=60) for served in (workers, single)]
    assert answers[0].status_code == answers[1].status_code == 413
    assert answers[0].json() == answers[1].json()


def test_a_cache_hit_decodes_nothing_in_any_process(workers, decode_log):
    body = {"image": {"b64": b64(jpeg(11))}, "text": "cached twice"}
    decode_log.write_text("")
    first = infer(workers.url, body)
    assert first.json()["cache"]["image"] == "miss"
    assert len(decode_log.read_text().split()) == 1
    api_processes = set(children_of(workers.process.pid))
    assert set(map(int, decode_log.read_text().split())) <= api_processes
    for _ in range(6):  # new connections: both API processes answer some of them
        again = httpx.post(f"{workers.url}/v1/infer", json=body, headers={"Connection": "close"}, timeout=60)
        assert again.json()["cache"]["image"] == "hit"
    assert len(decode_log.read_text().split()) == 1, "a hit must skip decoding in every process"


def series(text: str) -> set[tuple[str, tuple[str, ...]]]:
    """(sample name, label names) of every sample line of an exposition."""
    found = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            labels = tuple(sorted(part.split("=")[0] for part in rest.split("}")[0].split(",") if "=" in part))
            found.add((name.split(" ")[0], labels))
    return found


def sample(text: str, line_start: str) -> float:
    return float(next(line for line in text.splitlines() if line.startswith(line_start)).rsplit(" ", 1)[1])


def test_metrics_sum_both_api_processes_and_merge_their_quantiles(workers, single, decode_log):
    scrape = httpx.get(f"{workers.url}/metrics").text
    before = sample(scrape, 'mmserve_requests_total{code="200",route="vision"}') if 'route="vision"' in scrape else 0.0
    count_before = (sample(scrape, 'mmserve_stage_latency_seconds_count{route="vision",stage="total"}')
                    if 'mmserve_stage_latency_seconds_count{route="vision"' in scrape else 0.0)
    decode_log.write_text("")

    def send(index: int) -> None:  # a new image each: each is decoded where it was answered
        answer = httpx.post(f"{workers.url}/v1/infer", json={"image": {"b64": b64(jpeg(100 + index, (64, 48)))}},
                            headers={"Connection": "close"}, timeout=60)
        assert answer.status_code == 200

    num_requests = send_until_both_api_processes_worked(send, decode_log, at_least=24)
    answering = decode_log.read_text().split()
    assert len(answering) == num_requests
    assert len(set(answering)) == 2, "both API processes answered some requests"
    time.sleep(1.5)  # the records have reached the engine's monitor and been folded
    for _ in range(4):  # whichever process answers the scrape, the sums are the whole server's
        text = httpx.get(f"{workers.url}/metrics", headers={"Connection": "close"}).text
        assert sample(text, 'mmserve_requests_total{code="200",route="vision"}') - before == num_requests
        assert (sample(text, 'mmserve_stage_latency_seconds_count{route="vision",stage="total"}') - count_before
                == num_requests)
        p50 = sample(text, 'mmserve_stage_latency_seconds{quantile="0.5",route="vision",stage="total"}')
        p9999 = sample(text, 'mmserve_stage_latency_seconds{quantile="0.9999",route="vision",stage="total"}')
        assert 0 < p50 <= p9999
        assert sample(text, "mmserve_api_worker_restarts_total") == 0
        assert sample(text, "mmserve_api_workers_live") == 2
    # Same series and labels as one process (after the same kinds of requests), the restart count included.
    httpx.post(f"{single.url}/v1/infer", json={"image": {"b64": b64(jpeg(100, (64, 48)))}}, timeout=60)
    for body in ({"text": "a red bicycle"}, {"image": {"b64": b64(jpeg(1))}, "text": "a photo"}):
        httpx.post(f"{single.url}/v1/infer", json=body, timeout=60)
    time.sleep(1.5)  # folded into its monitor: run alone, this test is the one process's first traffic
    single_text = httpx.get(f"{single.url}/metrics").text
    assert sample(single_text, "mmserve_api_worker_restarts_total") == 0  # exported at N=1 too
    assert sample(single_text, "mmserve_api_workers_live") == 1
    assert {name for name, _ in series(text)} == {name for name, _ in series(single_text)}
    # The engine's monitor's baseline progress, one series a route as in one process (no engine label).
    baseline_series = {(name, labels) for name, labels in series(text) if name.startswith("mmserve_drift_baseline_")}
    assert baseline_series == {(name, labels) for name, labels in series(single_text)
                               if name.startswith("mmserve_drift_baseline_")}
    assert {name for name, _ in baseline_series} == {"mmserve_drift_baseline_samples",
                                                      "mmserve_drift_baseline_min_samples",
                                                      "mmserve_drift_baseline_frozen"}
    assert {labels for _, labels in baseline_series} == {("route",)}
    assert sample(text, 'mmserve_drift_baseline_samples{route="vision"}') >= 0
    assert sample(text, 'mmserve_drift_baseline_frozen{route="vision"}') == 0  # 5000 samples are far off


def lifetime_count(digests: dict, route: str, stage: str) -> int:
    return next((series["lifetime"]["n_values"] for series in digests["series"]
                 if series["route"] == route and series["stage"] == stage), 0)


def test_one_latency_monitor_holds_every_api_process_requests(workers, decode_log):
    """Drift is judged once, on all the traffic: the digests and drift state are the same from any process."""
    before = lifetime_count(httpx.get(f"{workers.url}/v1/monitoring/digests").json(), "vision", "total")
    decode_log.write_text("")

    def send(index: int) -> None:
        answer = httpx.post(f"{workers.url}/v1/infer", json={"image": {"b64": b64(jpeg(200 + index, (64, 48)))}},
                            headers={"Connection": "close"}, timeout=60)
        assert answer.status_code == 200

    num_requests = send_until_both_api_processes_worked(send, decode_log, at_least=16)
    assert len(set(decode_log.read_text().split())) == 2, "both API processes answered some requests"
    time.sleep(1.5)  # the records have reached the engine's monitor and been folded
    drift_states = []
    for _ in range(4):  # new connections: either API process answers
        digests = httpx.get(f"{workers.url}/v1/monitoring/digests", headers={"Connection": "close"}).json()
        assert lifetime_count(digests, "vision", "total") - before == num_requests
        drift = httpx.get(f"{workers.url}/v1/monitoring/drift", headers={"Connection": "close"}).json()
        drift_states.append((drift["baseline"]["started_unix_s"],  # each process's monitor started its own
                             {route: (state["state"], state["since_unix_s"]) for route, state in drift["routes"].items()}))
    assert all(state == drift_states[0] for state in drift_states)


def test_classify_and_rank_answer_as_the_single_process(workers, single):
    """The tiny model has no image-text score: the API process refuses as one process does, from the model's facts.

    (Answers with scores: ``test_api_workers_zero_shot``.)"""
    images = [{"b64": b64(jpeg(seed, (48, 40)))} for seed in (31, 32)]
    for path, body in (("/v1/classify", {"images": images, "labels": ["a cat", "a dog"]}),
                       ("/v1/rank", {"query": "a cat", "candidates": images}),
                       ("/v1/rank", {"query": images[0], "candidates": ["a cat", "a dog", "a car"]}),
                       ("/v1/rank", {"query": "a cat"})):
        ours = httpx.post(f"{workers.url}{path}", json=body, timeout=60)
        theirs = httpx.post(f"{single.url}{path}", json=body, timeout=60)
        assert ours.status_code == theirs.status_code, (path, ours.text, theirs.text)
        ours_json, theirs_json = ours.json(), theirs.json()
        ours_json.pop("id", None), theirs_json.pop("id", None)
        assert_same(ours_json, theirs_json)
    assert zero_shot_requests_counted(workers) == 4  # counted in the one /metrics


def zero_shot_requests_counted(served) -> float:
    text = httpx.get(f"{served.url}/metrics").text
    return sum(float(value) for value in re.findall(
        r'^mmserve_requests_total\{code="\d+",route="(?:classify|rank)"\} (\S+)$', text, re.M))

