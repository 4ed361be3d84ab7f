"""A compute thread that dies or hangs: probes fail, nobody waits forever, ``mmserve serve`` exits non-zero."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from server.runtime.lifecycle import EXIT_COMPUTE_FAULT



def _probe_statuses(client: httpx.Client) -> dict[str, int]:
    return {path: client.get(path).status_code for path in ("/health/live", "/health/ready", "/v2/health/live")}


# The thread's death is the point; pytest would report the SystemExit it ends with.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_compute_thread_fails_the_probes_and_every_waiting_request(live_server_factory, tiny_bundle,
                                                                          monkeypatch):
    with live_server_factory(max_batch_size=1, cache_text_bytes=0) as server, server.client() as client:
        assert _probe_statuses(client) == {"/health/live": 200, "/health/ready": 200, "/v2/health/live": 200}

        def crash(*args: object, **kwargs: object) -> None:
            time.sleep(0.3)  # long enough for the other requests to queue behind this batch
            raise SystemExit("the model thread crashed")  # a BaseException: batch splitting does not catch it

        monkeypatch.setattr(tiny_bundle.model, "encode_texts", crash)
        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda i: client.post("/v1/infer", json={"text": f"doomed {i}"}), range(4)))
        elapsed_s = time.monotonic() - started

        assert [answer.status_code for answer in answers] == [503] * 4
        assert {answer.json()["error"]["code"] for answer in answers} == {"not_ready"}
        assert all("died" in answer.json()["error"]["message"] for answer in answers)
        assert elapsed_s < 5.0, f"waiting requests were answered only after {elapsed_s:.1f} s"
        assert _probe_statuses(client) == {"/health/live": 503, "/health/ready": 503, "/v2/health/live": 503}
        late = client.post("/v1/infer", json={"text": "after the crash"})
        assert late.status_code == 503 and late.headers["Retry-After"] == "1"
        assert server.app.state.mmserve.router.fault.kind.value == "died"


def test_a_batch_past_the_hang_limit_fails_liveness_and_answers_its_requests(live_server_factory):
    with live_server_factory(compute_hang_s=0.3, enable_fault_injection=True, cache_text_bytes=0) as server, \
            server.client() as client:
        assert client.get("/health/live").status_code == 200
        # The compute thread now sleeps 3 s inside every text batch: ten times the hang limit.
        drill = client.post("/v1/admin/faults", json={"stage": "text", "delay_ms": 3000, "duration_s": 60})
        assert drill.status_code == 200
        started = time.monotonic()
        stuck = client.post("/v1/infer", json={"text": "stuck behind a hung model"})
        elapsed_s = time.monotonic() - started

        assert stuck.status_code == 503 and "hung" in stuck.json()["error"]["message"]
        assert elapsed_s < 2.5, "the request waited for the hung batch instead of being failed"
        live = client.get("/health/live")
        assert live.status_code == 503 and live.json()["status"] == "dead"
        assert client.get("/health/ready").status_code == 503
        assert client.post("/v1/infer", json={"text": "another"}).status_code == 503


def test_serve_exits_non_zero_by_itself_when_the_model_hangs(serve_process):
    args = ["--preset", "tiny", "--device", "cpu", "--enable-fault-injection"]
    with serve_process(args, {"MMSERVE_COMPUTE_HANG_S": "0.5"}) as served:
        httpx.post(f"{served.url}/v1/admin/faults", json={"stage": "text", "delay_ms": 30_000, "duration_s": 60})
        hung_at = time.monotonic()
        try:
            answer = httpx.post(f"{served.url}/v1/infer", json={"text": "hang here"}, timeout=30).status_code
        except httpx.TransportError:
            answer = "connection closed"
        exit_code = served.process.wait(timeout=30)
        exited_after_s = time.monotonic() - hung_at
        output = served.process.stdout.read()
    assert answer in (503, "connection closed")
    assert exit_code == EXIT_COMPUTE_FAULT, output
    assert exited_after_s < 15.0, f"exited {exited_after_s:.1f} s after the hang began"
    assert "hung" in output
