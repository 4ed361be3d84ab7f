"""Pixel slots never refuse what one process accepts: ``--api-workers 2`` takes and sheds as ``--api-workers 1``.

A vision drill stalls the lane's first batch; four-image requests follow one
at a time until the lane's queue bound and past it. One process queues as
many as the bound allows and refuses the rest with 503 ``overloaded``; with two
API processes, each holding only four pixel slots (one request's images), the
answers must be the same, since a slot is free again as soon as the engine
has copied its pixels out, not when the stalled request is answered.
"""

from __future__ import annotations

import re
import threading
import time

import httpx

from encoded_images import b64, encoded_image
from tests.conftest import run_serve_processes

VISION_QUEUE_BOUND = 2
NUM_REQUESTS = 1 + VISION_QUEUE_BOUND + 2  # one stalled in its batch, the bound queued, two refused
ENV = {"MMSERVE_ENABLE_FAULT_INJECTION": "true", "MMSERVE_CACHE_IMAGE_BYTES": "0",
       "MMSERVE_VISION_MAX_BATCH_SIZE": "4",  # a four-image request fills its batch: it runs at once
       "MMSERVE_VISION_MAX_QUEUE_SIZE": str(VISION_QUEUE_BOUND), "MMSERVE_PIXEL_SLOTS": "4"}
STALL = {"stage": "vision", "delay_ms": 4000, "fraction": 1.0, "duration_s": 60}


def vision_queue_depth(url: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Connection": "close"}, timeout=10).text
    # Summed over the series: with API processes, each engine's depth is a series of its own (label engine).
    depths = re.findall(r'^mmserve_queue_depth\{[^}]*lane="vision"[^}]*\} (\S+)$', text, re.M)
    assert depths, "no vision queue depth on /metrics"
    return sum(map(float, depths))


def four_images(seed: int) -> dict:
    return {"images": [{"b64": b64(encoded_image(seed * 10 + index, (40, 30), "PNG"))} for index in range(4)]}


def stalled_lane_answers(url: str) -> list[tuple[int, str | None]]:
    """Each request's status and error code, sent one at a time into a stalled vision lane."""
    assert httpx.post(f"{url}/v1/admin/faults", json=STALL, timeout=10).status_code == 200
    answers: list[tuple[int, str | None] | None] = [None] * NUM_REQUESTS

    def send(index: int) -> None:
        response = httpx.post(f"{url}/v1/infer", json=four_images(index), headers={"Connection": "close"},
                              timeout=60)
        error = response.json().get("error") if response.status_code != 200 else None
        assert response.status_code == 200 or "Retry-After" in response.headers
        answers[index] = (response.status_code, error["code"] if error else None)

    threads = [threading.Thread(target=send, args=(index,)) for index in range(NUM_REQUESTS)]
    queued = 0
    for index, thread in enumerate(threads):
        thread.start()
        if index == 0:
            time.sleep(1.0)  # decoded and in its batch, which the drill holds for 4 s
            continue
        deadline = time.monotonic() + 10
        while answers[index] is None and vision_queue_depth(url) == queued:  # refused, or queued
            assert time.monotonic() < deadline, f"request {index} neither queued nor answered"
            time.sleep(0.02)
        queued = int(vision_queue_depth(url))
    assert httpx.delete(f"{url}/v1/admin/faults", timeout=10).status_code == 200  # the queued batches run freely
    for thread in threads:
        thread.join(60)
    return answers  # type: ignore[return-value]


def test_two_api_processes_accept_and_refuse_what_one_process_does_in_a_stalled_vision_lane():
    args = ["--preset", "tiny", "--device", "cpu", "--api-workers"]
    with run_serve_processes([([*args, "1"], ENV), ([*args, "2"], ENV)], ready_timeout_s=300) as (single, served):
        one_process = stalled_lane_answers(single.url)
        two_processes = stalled_lane_answers(served.url)
    expected = [(200, None)] * (1 + VISION_QUEUE_BOUND) + [(503, "overloaded")] * 2
    assert one_process == expected, one_process
    assert two_processes == one_process, two_processes
