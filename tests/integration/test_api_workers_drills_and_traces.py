"""``--api-workers 2``: fault drills, traces and exemplars as one process gives them.

One server with two API processes and one engine, and a single-process server
of the same model and settings beside it; both trace every request to one
OTLP receiver and take admin calls only with the admin key.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from encoded_images import b64, encoded_image
from otlp_receiver import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.conftest import run_serve_processes
from tests.integration.work_logs import send_until_both_api_processes_worked

TINY = ["--preset", "tiny", "--device", "cpu", "--enable-fault-injection"]
HOOKS = str(Path(__file__).parent / "api_workers_hooks")
INFERENCE_KEY, ADMIN_KEY = "inference-key-for-tests", "admin-key-for-tests"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
CALLER_SPAN_ID = 0x00F067AA0BA902B7
DRILL_MS = 500  # well above a small image's decode on a busy machine


@pytest.fixture(scope="module")
def receiver():
    with otlp_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def decode_log(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("decodes") / "decodes.log"


def _env(receiver: OtlpReceiver, decode_log: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([HOOKS, os.environ.get("PYTHONPATH", "")]),
            "MMSERVE_TEST_DECODE_LOG": str(decode_log),
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.traces_url, "OTEL_BSP_SCHEDULE_DELAY": "50",
            "MMSERVE_TRACE_SAMPLE_RATIO": "1.0", "MMSERVE_TRACE_SLOW_MS": "0",
            "MMSERVE_API_KEYS": INFERENCE_KEY, "MMSERVE_ADMIN_API_KEYS": ADMIN_KEY}


@pytest.fixture(scope="module")
def servers(receiver, decode_log, tmp_path_factory):
    """The ``--api-workers 2`` server and the one-process server, started side by side."""
    single_env = _env(receiver, tmp_path_factory.mktemp("single") / "decodes.log")
    with run_serve_processes([([*TINY, "--api-workers", "2"], _env(receiver, decode_log)), (TINY, single_env)]) as both:
        yield both


@pytest.fixture(scope="module")
def workers(servers):
    return servers[0]


@pytest.fixture(scope="module")
def single(servers):
    return servers[1]


def jpeg(seed: int) -> str:
    return b64(encoded_image(seed, (64, 48), "JPEG"))


def fresh_connection_infer(url: str, body: dict, headers: dict | None = None) -> httpx.Response:
    """Keep-alive off: each request a new connection, accepted by either API process."""
    return httpx.post(f"{url}/v1/infer", json=body, headers={**ADMIN, "Connection": "close", **(headers or {})},
                      timeout=60)


def faults_call(url: str, method: str, headers: dict, body: dict | None = None) -> httpx.Response:
    return httpx.request(method, f"{url}/v1/admin/faults", json=body, headers={**headers, "Connection": "close"},
                         timeout=30)


def test_the_admin_faults_routes_answer_and_refuse_as_one_process(workers, single):
    drill = {"stage": "vision", "delay_ms": 1, "duration_s": 5}
    cases = [("POST", {}, drill), ("POST", {"Authorization": f"Bearer {INFERENCE_KEY}"}, drill),
             ("DELETE", {"Authorization": f"Bearer {INFERENCE_KEY}"}, None),
             ("POST", ADMIN, {"stage": "tokenize", "delay_ms": 1}),
             ("POST", ADMIN, {"stage": "vision", "delay_ms": -1}),
             ("POST", ADMIN, {"stage": "decode", "delay_ms": 1, "only_encoding": "gif89"}),
             ("POST", ADMIN, drill), ("DELETE", ADMIN, None)]
    for method, headers, body in cases:
        ours, theirs = faults_call(workers.url, method, headers, body), faults_call(single.url, method, headers, body)
        assert ours.status_code == theirs.status_code, (method, headers, body, ours.text, theirs.text)
        assert ours.json() == theirs.json(), (method, body)
    assert [faults_call(workers.url, method, headers, body).status_code for method, headers, body in cases] == [
        401, 403, 403, 422, 422, 422, 200, 200]


def test_a_decode_drill_set_through_one_connection_delays_both_api_processes_until_deleted(workers, decode_log):
    set_drill = faults_call(workers.url, "POST", ADMIN, {"stage": "decode", "delay_ms": DRILL_MS, "duration_s": 120})
    assert set_drill.status_code == 200 and set_drill.json()["active"][0]["stage"] == "decode"
    decode_log.write_text("")
    try:
        def send_delayed(index: int) -> None:  # a new image each: decoded by the API process that answered it
            started_s = time.monotonic()
            answer = fresh_connection_infer(workers.url, {"image": {"b64": jpeg(200 + index)}})
            assert answer.status_code == 200, answer.text
            assert answer.json()["timings_ms"]["decode"] >= DRILL_MS
            assert time.monotonic() - started_s >= DRILL_MS / 1000

        send_until_both_api_processes_worked(send_delayed, decode_log, at_least=16, at_most=90)
        delayed_by = set(decode_log.read_text().split())
        assert len(delayed_by) == 2, "both API processes answered some of the delayed requests"
    finally:
        cleared = faults_call(workers.url, "DELETE", ADMIN)
    assert cleared.status_code == 200 and cleared.json() == {"active": []}
    decode_log.write_text("")

    def send_undelayed(index: int) -> None:
        answer = fresh_connection_infer(workers.url, {"image": {"b64": jpeg(300 + index)}})
        assert answer.status_code == 200 and answer.json()["timings_ms"]["decode"] < DRILL_MS

    send_until_both_api_processes_worked(send_undelayed, decode_log, at_least=16, at_most=90)
    assert len(set(decode_log.read_text().split())) == 2


def test_a_compute_drill_delays_the_engine_for_every_api_process(workers):
    assert faults_call(workers.url, "POST", ADMIN, {"stage": "text", "delay_ms": DRILL_MS}).status_code == 200
    try:
        for index in range(4):
            answer = fresh_connection_infer(workers.url, {"text": f"a delayed text {index}", "use_cache": False})
            assert answer.status_code == 200 and answer.json()["timings_ms"]["text"] >= DRILL_MS
    finally:
        assert faults_call(workers.url, "DELETE", ADMIN).status_code == 200
    answer = fresh_connection_infer(workers.url, {"text": "a quick text", "use_cache": False})
    assert answer.json()["timings_ms"]["text"] < DRILL_MS


# -- traces ------------------------------------------------------------------------------------------


def as_int(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


def trace_shape(spans: list[ReceivedSpan], trace_id: int) -> tuple | None:
    """A request's trace as structure only: span names, who is whose child, what links to what.

    ``None`` while a span of it has not arrived.
    """
    by_id = {as_int(span.span.span_id): span for span in spans}
    mine = [span for span in spans if as_int(span.span.trace_id) == trace_id]
    roots = [span for span in mine if span.span.kind == Span.SpanKind.SPAN_KIND_SERVER]
    if len(roots) != 1:
        return None
    root = roots[0].span

    def subtree(span_id: int) -> tuple:
        children = [span for span in mine if as_int(span.span.parent_span_id) == span_id]
        return tuple(sorted((child.name, subtree(as_int(child.span.span_id))) for child in children))

    batches = []
    for link in root.links:
        batch = by_id.get(as_int(link.span_id))
        if batch is None:
            return None
        batches.append((batch.name, as_int(batch.span.trace_id) != trace_id, len(batch.span.parent_span_id) == 0,
                        as_int(root.span_id) in {as_int(back.span_id) for back in batch.span.links}))
    return (root.name, as_int(root.parent_span_id) == CALLER_SPAN_ID, subtree(as_int(root.span_id)),
            tuple(sorted(set(batches))))  # how the rows fell into batches is the batcher's timing


REQUESTS = [
    ("/v1/infer", {"text": "a red bicycle", "image": {"b64": b64(encoded_image(7, (40, 30), "PNG"))},
                   "use_cache": False}),
    ("/v1/infer", {"text": "only words", "use_cache": False}),
    ("/v1/embeddings", {"input": ["one row", "another row"], "model": "tiny"}),
]


@pytest.mark.parametrize(("path", "body"), REQUESTS, ids=["fusion", "text", "openai_rows"])
def test_a_requests_spans_from_both_processes_have_one_process_structure(workers, single, receiver, path, body):
    trace_ids = {}
    for name, served in (("single", single), ("workers", workers)):
        trace_id = int.from_bytes(os.urandom(16), "big") | 1
        answer = httpx.post(f"{served.url}{path}", json=body, timeout=60, headers={
            **ADMIN, "traceparent": f"00-{trace_id:032x}-{CALLER_SPAN_ID:016x}-01"})
        assert answer.status_code == 200, answer.text
        trace_ids[name] = trace_id
    expected = trace_shape(receiver.wait_for_spans(lambda spans: trace_shape(spans, trace_ids["single"]) is not None),
                           trace_ids["single"])
    assert expected[1] and expected[3] and all(batch[1:] == (True, True, True) for batch in expected[3])
    spans = receiver.wait_for_spans(lambda spans: trace_shape(spans, trace_ids["workers"]) == expected)
    assert trace_shape(spans, trace_ids["workers"]) == expected
    request_spans = [span for span in spans if as_int(span.span.trace_id) == trace_ids["workers"]]
    assert {span.resource["mmserve.process"] for span in request_spans} == {"api"}
    assert len({span.resource["process.pid"] for span in request_spans}) == 1
    links = {as_int(link.span_id) for span in request_spans for link in span.span.links}
    batch_spans = [span for span in spans if as_int(span.span.span_id) in links]
    assert {span.resource["mmserve.process"] for span in batch_spans} == {"engine"}


def test_stage_spans_last_what_the_answer_says_and_each_api_process_exports_its_own(workers, receiver, decode_log):
    answers = []

    def send(index: int) -> None:
        answer = fresh_connection_infer(workers.url, {"text": "a photo", "image": {"b64": jpeg(400 + index)},
                                                      "use_cache": False})
        assert answer.status_code == 200
        answers.append(answer)

    decode_log.write_text("")
    send_until_both_api_processes_worked(send, decode_log, at_least=16, at_most=90)
    trace_ids = {int(answer.headers["traceparent"].split("-")[1], 16): answer for answer in answers}
    spans = receiver.wait_for_spans(lambda spans: all(trace_shape(spans, trace_id) for trace_id in trace_ids))
    pids = set()
    for trace_id, answer in trace_ids.items():
        mine = [span for span in spans if as_int(span.span.trace_id) == trace_id]
        (root,) = [span for span in mine if span.span.kind == Span.SpanKind.SPAN_KIND_SERVER]
        pids.add(root.resource["process.pid"])
        stages = {span.name: span.span for span in mine if span.span.parent_span_id == root.span.span_id}
        timings_ms = answer.json()["timings_ms"]
        assert set(stages) == {"decode", "queue", "vision", "text", "fusion", "respond"}
        for stage, span in stages.items():  # one clock across the processes: each lasts what timings_ms says
            assert round((span.end_time_unix_nano - span.start_time_unix_nano) / 1e6, 3) == timings_ms[stage], stage
        assert stages["decode"].end_time_unix_nano <= stages["queue"].start_time_unix_nano
        assert root.span.start_time_unix_nano <= stages["decode"].start_time_unix_nano
    assert len(pids) == 2, "both API processes exported request spans"


def test_exemplars_of_every_api_process_reach_the_merged_openmetrics_scrape(workers):
    kept = [fresh_connection_infer(workers.url, {"text": f"exemplar {index}"}) for index in range(6)]
    assert all(answer.status_code == 200 for answer in kept)
    latest = kept[-1].headers["traceparent"].split("-")[1]  # the newest exemplar of its bucket, in one process

    def scraped_exemplars() -> set[str]:  # on a new connection: either API process answers
        scrape = httpx.get(f"{workers.url}/metrics", headers={
            "Accept": "application/openmetrics-text; version=1.0.0", "Connection": "close"}, timeout=30)
        assert scrape.headers["content-type"].startswith("application/openmetrics-text")
        return {sample.exemplar.labels["trace_id"] for family in text_string_to_metric_families(scrape.text)
                if family.name == "mmserve_request_duration_seconds" for sample in family.samples
                if sample.exemplar is not None and sample.labels.get("route") == "text"}

    # Every API process has written its snapshot since: a scrape asks each for one, so this is soon; it waited a
    # fixed 1.5 s before, which stays the bound.
    settled_by = time.monotonic() + 1.5
    while latest not in scraped_exemplars() and time.monotonic() < settled_by:
        time.sleep(0.05)
    for _ in range(6):  # whichever process answers the scrape, its own exemplar or the other's
        assert latest in scraped_exemplars()
    plain = httpx.get(f"{workers.url}/metrics", timeout=30)
    assert plain.headers["content-type"].startswith("text/plain") and "trace_id" not in plain.text


def api_processes(supervisor_pid: int) -> set[int]:
    found = set()
    for pid in Path(f"/proc/{supervisor_pid}/task/{supervisor_pid}/children").read_text().split():
        try:
            if b"api_process" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(int(pid))
        except FileNotFoundError:  # reaped meanwhile
            continue
    return found


def test_an_api_process_started_again_receives_the_drills_in_force(workers, decode_log):
    """Last in this module: it kills one of the server's API processes."""
    assert faults_call(workers.url, "POST", ADMIN, {"stage": "decode", "delay_ms": DRILL_MS,
                                                    "duration_s": 300}).status_code == 200
    try:
        killed = min(api_processes(workers.process.pid))
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 180
        while True:
            running = api_processes(workers.process.pid)
            metrics = httpx.get(f"{workers.url}/metrics", headers={"Connection": "close"}, timeout=10).text
            if killed not in running and len(running) == 2 and "\nmmserve_api_workers_live 2.0\n" in metrics:
                break  # the new one serves too (readiness stays 200 throughout: the survivor answers it)
            assert time.monotonic() < deadline, "the killed API process was not started again"
            time.sleep(0.2)
        decode_log.write_text("")
        for seed in range(16):
            answer = fresh_connection_infer(workers.url, {"image": {"b64": jpeg(500 + seed)}})
            assert answer.status_code == 200 and answer.json()["timings_ms"]["decode"] >= DRILL_MS
        assert set(map(int, decode_log.read_text().split())) == running  # the new one delayed its requests too
    finally:
        assert faults_call(workers.url, "DELETE", ADMIN).status_code == 200
