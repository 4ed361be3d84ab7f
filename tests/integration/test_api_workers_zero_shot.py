"""``/v1/classify`` and ``/v1/rank`` with ``--api-workers 2``: prepared in the API process, scored in the engine.

A random CLIP written with transformers' ``save_pretrained`` is served by a
single process and by two API processes in front of an engine, both with 8
labels and 4 candidates at most (so ``test_zero_shot_api``'s refusals apply
as written). Every process of the two-process server logs each text it
tokenizes, each image it decodes and each array it turns into the model's
input (``api_workers_hooks``), so a test sees which process did the work.
Answers (scores, order, ``cache`` field, errors) are compared with the
single process's for the same requests sent in the same order.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from benchmarks.random_pretrained import write_clip
from encoded_images import b64, encoded_image
from otlp_receiver import OtlpReceiver, otlp_receiver
from tests.conftest import run_serve_processes
from tests.integration.same_answers import assert_same
from tests.integration.test_api_workers_drills_and_traces import CALLER_SPAN_ID, as_int, trace_shape
from tests.integration.test_zero_shot_api import LIMIT_CASES
from tests.integration.trained_head_repository import write_tiny_with_a_trained_head
from tests.integration.work_logs import Logged, serve_logged_side_by_side

pytestmark = pytest.mark.long  # minutes together: started first (tests/conftest.py)

LIMITS = {"MMSERVE_MAX_LABELS_PER_REQUEST": "8", "MMSERVE_MAX_CANDIDATES_PER_REQUEST": "4"}


def _serve_both(tmp_path_factory, model_dir: Path, receiver: OtlpReceiver) -> Iterator[list[Logged]]:
    """The ``--api-workers 2`` server and the one-process server, started side by side."""
    env = {**LIMITS, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.traces_url, "OTEL_BSP_SCHEDULE_DELAY": "50",
           "MMSERVE_TRACE_SAMPLE_RATIO": "1.0", "MMSERVE_TRACE_SLOW_MS": "0"}
    args = ["--model", str(model_dir), "--device", "cpu"]
    with serve_logged_side_by_side([(tmp_path_factory.mktemp("logs"), [*args, "--api-workers", "2"], env),
                                    (tmp_path_factory.mktemp("logs"), args, env)]) as both:
        yield both


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> Path:
    return write_clip(tmp_path_factory.mktemp("models") / "tiny-clip")


@pytest.fixture(scope="module")
def servers(tmp_path_factory, clip_dir, receiver) -> Iterator[list[Logged]]:
    yield from _serve_both(tmp_path_factory, clip_dir, receiver)


@pytest.fixture(scope="module")
def workers(servers) -> Logged:
    return servers[0]


@pytest.fixture(scope="module")
def single(servers) -> Logged:
    return servers[1]


def image(seed: int, size=(48, 40), fmt="JPEG") -> dict:
    return {"b64": b64(encoded_image(seed, size, fmt))}


def _comparable(answer: httpx.Response) -> tuple[int, dict]:
    """Status and body without what differs between any two answers (id, times); the stages' names kept."""
    body = answer.json()
    assert answer.headers["x-request-id"] == body.get("id", answer.headers["x-request-id"])
    body.pop("id", None)
    if "timings_ms" in body:
        body["timings_ms"] = sorted(body["timings_ms"])
    return answer.status_code, body


def _post_both(workers: Logged, single: Logged, path: str, body: dict) -> tuple[httpx.Response, httpx.Response]:
    ours = httpx.post(f"{workers.url}{path}", json=body, headers={"Connection": "close"}, timeout=60)
    theirs = httpx.post(f"{single.url}{path}", json=body, headers={"Connection": "close"}, timeout=60)
    return ours, theirs


ANSWERED = [
    ("/v1/classify", {"image": image(1), "labels": ["a cat", "two dogs", "a red bicycle", "一只猫"]}),
    ("/v1/classify", {"images": [image(2), image(3, (36, 36), "PNG")], "labels": ["a cat", "a car"],
                      "template": "a picture of {}", "top_k": 1}),
    ("/v1/classify", {"image": image(1), "labels": ["a cat", "two dogs", "a red bicycle", "一只猫"]}),  # all hits
    ("/v1/classify", {"image": image(4), "labels": ["a cat", "a cat", "snow"], "use_cache": False}),
    ("/v1/classify", {"image": image(5), "labels": ["a very long label " * 20], "truncate": True}),
    ("/v1/rank", {"query": "a cat on a sofa", "candidates": [image(6), image(7), image(1)]}),
    ("/v1/rank", {"query": image(8), "candidates": ["a cat", "two dogs", "a blue car", "snow"], "top_k": 2}),
]


def test_answers_equal_the_single_process_in_scores_order_cache_and_stages(workers, single):
    for path, body in ANSWERED:  # the same order on both servers: the same cache statuses
        ours, theirs = _post_both(workers, single, path, body)
        assert theirs.status_code == 200, theirs.text
        assert_same(_comparable(ours), _comparable(theirs))
    statuses = _comparable(httpx.post(f"{workers.url}/v1/classify", json=ANSWERED[0][1], timeout=60))[1]["cache"]
    assert statuses == {"images": ["hit"], "texts": {"hit": 4, "miss": 0, "coalesced": 0, "bypass": 0}}


@pytest.mark.parametrize(("path", "body", "status", "code", "field"), LIMIT_CASES,
                         ids=[case[3] + "-" + case[4] for case in LIMIT_CASES])
def test_refusals_equal_the_single_process_and_the_server_keeps_answering(workers, single, path, body, status,
                                                                          code, field):
    filled = {key: ([image(9) if v == "IMG" else v for v in value] if isinstance(value, list)
                    else image(9) if value == "IMG" else value) for key, value in body.items()}
    ours, theirs = _post_both(workers, single, path, filled)
    assert (theirs.status_code, theirs.json()["error"]["code"], theirs.json()["error"].get("field")) == (
        status, code, field)
    assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json())
    again = httpx.post(f"{workers.url}/v1/classify", json={"image": image(9), "labels": ["still", "serving"]},
                       timeout=60)
    assert again.status_code == 200, again.text


def test_the_api_process_tokenizes_and_decodes_and_a_repeat_runs_nothing_anywhere(workers):
    (engine,) = workers.children("engine_process")
    api_processes = workers.children("api_process")
    pixels = np.random.default_rng(22).integers(0, 256, (40, 52, 3), dtype=np.uint8)  # raw: no decode, one array
    raw = {"uint8": {"shape": [40, 52, 3], "b64": b64(pixels.tobytes())}}
    body = {"images": [image(21), raw], "labels": [f"moved label {i}" for i in range(6)]}
    with httpx.Client(base_url=workers.url, timeout=60) as client:  # one connection: one API process
        before = workers.counts()
        first = client.post("/v1/classify", json=body)
        middle = workers.counts()
        second = client.post("/v1/classify", json=body)
        after = workers.counts()
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    for name in ("tokenize", "decode", "pixels"):  # the first: done in one API process, never in the engine
        grown = middle[name] - before[name]
        assert engine not in grown, (name, grown)
        assert set(grown) <= api_processes and len(grown) == 1, (name, grown)
    (answering,) = set(middle["tokenize"] - before["tokenize"])
    assert middle["tokenize"][answering] - before["tokenize"][answering] == 6  # each label once, here
    assert middle["decode"][answering] - before["decode"][answering] == 1  # the JPEG, here
    assert middle["pixels"][answering] - before["pixels"][answering] == 1  # the raw pixels, here
    assert first.json()["cache"] == {"images": ["miss", "miss"],
                                     "texts": {"hit": 0, "miss": 6, "coalesced": 0, "bypass": 0}}
    assert after == middle  # the repeat: labels remembered, images and labels cache hits: no process worked
    assert second.json()["cache"] == {"images": ["hit", "hit"],
                                      "texts": {"hit": 6, "miss": 0, "coalesced": 0, "bypass": 0}}
    assert_same(second.json()["results"], first.json()["results"])


def test_a_classify_trace_has_the_single_process_structure_its_batches_from_the_engine(workers, single, receiver):
    body = {"images": [image(61), image(62)], "labels": ["traced cat", "traced dog"], "use_cache": False}
    trace_ids = {}
    for name, served in (("single", single), ("workers", workers)):
        trace_id = int.from_bytes(os.urandom(16), "big") | 1
        answer = httpx.post(f"{served.url}/v1/classify", json=body, timeout=60,
                            headers={"traceparent": f"00-{trace_id:032x}-{CALLER_SPAN_ID:016x}-01"})
        assert answer.status_code == 200, answer.text
        assert answer.headers["traceparent"].split("-")[1] == f"{trace_id:032x}"
        trace_ids[name] = trace_id
    expected = trace_shape(receiver.wait_for_spans(lambda spans: trace_shape(spans, trace_ids["single"]) is not None),
                           trace_ids["single"])
    assert expected[0] == "POST /v1/classify" and expected[1] and expected[3]  # under the caller; linked batches
    spans = receiver.wait_for_spans(lambda spans: trace_shape(spans, trace_ids["workers"]) == expected)
    request_spans = [span for span in spans if as_int(span.span.trace_id) == trace_ids["workers"]]
    assert {span.resource["mmserve.process"] for span in request_spans} == {"api"}
    root = next(span for span in request_spans if span.name == "POST /v1/classify")
    assert root.attributes["mmserve.route"] == "classify" and root.attributes["mmserve.rows"] == 2
    links = {as_int(link.span_id) for span in request_spans for link in span.span.links}
    assert {span.resource["mmserve.process"] for span in spans if as_int(span.span.span_id) in links} == {"engine"}


def test_requests_count_and_time_under_their_routes_in_the_one_metrics(workers):
    httpx.post(f"{workers.url}/v1/rank", json={"query": image(31), "candidates": ["metrics a", "metrics b"]},
               timeout=60).raise_for_status()
    deadline, exported = time.monotonic() + 10, ""
    wanted = [f'mmserve_stage_latency_seconds{{quantile="0.5",route="{route}",stage="{stage}"}}'
              for route in ("classify", "rank") for stage in ("decode", "text", "score", "total")]
    while time.monotonic() < deadline:
        exported = httpx.get(f"{workers.url}/metrics").text
        if all(line in exported for line in wanted):
            break
        time.sleep(0.2)
    assert [line for line in wanted if line not in exported] == []
    counted = re.findall(r'^mmserve_requests_total\{code="200",route="rank"\} (\S+)$', exported, re.M)
    assert counted and float(counted[0]) >= 1


@pytest.mark.parametrize("exit_path", ["deadline", "client_left"])
def test_a_request_that_ends_early_leaves_its_labels_servable(workers, exit_path):
    labels = [f"{exit_path} early label {index}" for index in range(8)]
    body = {"image": image(41), "labels": labels}
    if exit_path == "deadline":
        answer = httpx.post(f"{workers.url}/v1/classify", json={**body, "timeout_ms": 1}, timeout=60)
        assert answer.status_code in (503, 504), answer.text
        assert answer.json()["error"]["code"] in ("overloaded", "deadline_exceeded")
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{workers.url}/v1/classify", json=body, timeout=0.001)
    for _ in range(4):  # every API process: no label left claimed by the call that ended
        answer = httpx.post(f"{workers.url}/v1/classify", json=body, headers={"Connection": "close"}, timeout=30)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["results"][0]["labels"]) == len(labels)


def test_a_trained_fusion_head_scores_in_the_engine_as_in_one_process(tmp_path):
    repository = write_tiny_with_a_trained_head(tmp_path / "tiny")
    bodies = [("/v1/classify", {"images": [image(51), image(52)], "labels": ["cat", "a dog", "bicycle"],
                                "template": "a {}"}),
              ("/v1/rank", {"query": image(51), "candidates": ["cat", "a dog", "bicycle"]}),
              ("/v1/rank", {"query": "a dog", "candidates": [image(51), image(52)]})]
    args = ["--model", str(repository), "--device", "cpu"]
    with run_serve_processes([([*args, "--api-workers", "2"], None), (args, None)]) as (workers, single):
        for path, body in bodies:
            ours = httpx.post(f"{workers.url}{path}", json=body, timeout=60)
            theirs = httpx.post(f"{single.url}{path}", json=body, timeout=60)
            assert theirs.status_code == 200 and theirs.json()["score_kind"] == "match_score", theirs.text
            assert_same(_comparable(ours), _comparable(theirs))
        scores = [entry["score"] for entry in ours.json()["results"]]
        assert np.all(np.diff(scores) <= 0)  # best first
