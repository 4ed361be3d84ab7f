"""Text requests are answered while an image batch runs, and the image thread runs at a lower priority."""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from encoded_images import encoded_image_b64

STALL_MS = 1500
IMAGE_B64 = encoded_image_b64(0, (32, 32))


def _text_latency_during_a_stalled_vision_batch(server) -> tuple[float, bool]:
    """Seconds a text request took while a vision batch sleeps ``STALL_MS``; and whether vision was still busy."""
    with server.client() as client, ThreadPoolExecutor(1) as pool:
        drill = client.post("/v1/admin/faults", json={"stage": "vision", "delay_ms": STALL_MS, "duration_s": 60})
        assert drill.status_code == 200, drill.text
        with httpx.Client(base_url=server.url, timeout=30) as other:
            vision = pool.submit(other.post, "/v1/infer", json={"image": {"b64": IMAGE_B64}})
            time.sleep(0.3)  # the vision batch is on its thread now, stalled
            started = time.monotonic()
            text = client.post("/v1/infer", json={"text": "not behind the images"})
            elapsed_s = time.monotonic() - started
            vision_busy = not vision.done()
            assert text.status_code == 200 and vision.result().status_code == 200
    return elapsed_s, vision_busy


def test_a_text_request_does_not_wait_for_a_running_vision_batch(live_server_factory):
    with live_server_factory(enable_fault_injection=True, cache_image_bytes=0) as server:
        elapsed_s, vision_busy = _text_latency_during_a_stalled_vision_batch(server)
    assert vision_busy, "the vision batch had already finished: the test did not overlap them"
    assert elapsed_s < STALL_MS / 1000 / 2, f"the text request took {elapsed_s:.2f} s beside a stalled vision batch"


def test_with_one_shared_executor_the_text_request_waits_for_the_vision_batch(live_server_factory):
    with live_server_factory(enable_fault_injection=True, cache_image_bytes=0,
                             separate_text_executor=False) as server:
        elapsed_s, _ = _text_latency_during_a_stalled_vision_batch(server)
    assert elapsed_s > (STALL_MS / 1000 - 0.3) * 0.9, f"the text request took only {elapsed_s:.2f} s"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are a Linux notion")
def test_image_work_runs_at_the_configured_lower_priority(live_server_factory):
    base_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with live_server_factory(image_work_nice=4, decode_threads=1, inline_image_max_pixels=0) as server, server.client() as client:
        assert client.post("/v1/infer", json={"image": {"b64": IMAGE_B64}}).status_code == 200  # starts a decode thread
        threads = {thread.name: thread.native_id for thread in threading.enumerate()}
        names = ("mmserve-text", "mmserve-image", "mmserve-decode_0")
        nice = {name: os.getpriority(os.PRIO_PROCESS, threads[name]) for name in names}
    lowered = min(19, base_nice + 4)
    assert nice == {"mmserve-text": base_nice, "mmserve-image": lowered, "mmserve-decode_0": lowered}
