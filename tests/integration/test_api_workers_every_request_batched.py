"""With ``--api-workers 2`` every answered request went through a tower batch, once.

The API processes send a turn's calls and latency records to the engine in one
frame, and the engine answers a turn's calls in one frame
(``server.workers.frames.CorkedFrameWriter``): many requests share a frame
both ways. The batch-size histogram's sum (requests in batches, by lane) must
still equal the requests answered, and each answer must be its own request's.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

from encoded_images import encoded_image_b64
from tests.conftest import run_serve_process

NUM_TEXTS, NUM_IMAGES = 96, 32


def metric_sum(text: str, name: str) -> float:
    return sum(float(value) for value in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_the_batch_size_histograms_sum_equals_the_requests_answered():
    env = {"MMSERVE_CACHE_TEXT_BYTES": "0", "MMSERVE_CACHE_IMAGE_BYTES": "0"}
    with run_serve_process(["--preset", "tiny", "--device", "cpu", "--api-workers", "2"], env,
                           ready_timeout_s=300) as served:
        bodies = ([{"text": f"text number {index}"} for index in range(NUM_TEXTS)]
                  + [{"image": {"b64": encoded_image_b64(index, (32, 24))}} for index in range(NUM_IMAGES)])

        def send(client_index: int) -> list[tuple[dict, httpx.Response]]:
            with httpx.Client(base_url=served.url, timeout=120) as client:  # keep-alive: one API process each
                return [(body, client.post("/v1/infer", json=body)) for body in bodies[client_index::16]]

        with ThreadPoolExecutor(16) as pool:  # 16 connections at once: turns with several requests
            answered = [pair for pairs in pool.map(send, range(16)) for pair in pairs]
        metrics = httpx.get(f"{served.url}/metrics", timeout=30).text
        alone = {index: httpx.post(f"{served.url}/v1/infer", json=bodies[index], timeout=60).json()
                 for index in (0, 1, NUM_TEXTS - 1, NUM_TEXTS, NUM_TEXTS + NUM_IMAGES - 1)}

    assert [response.status_code for _, response in answered] == [200] * (NUM_TEXTS + NUM_IMAGES)
    for body, response in answered:
        assert response.json()["route"] == ("text" if "text" in body else "vision")
    by_body = {id(body): response.json() for body, response in answered}
    for index, answer in alone.items():  # each answer is its own request's, not a frame neighbour's
        key = "text_embedding" if index < NUM_TEXTS else "image_embedding"
        np.testing.assert_allclose(by_body[id(bodies[index])][key], answer[key], atol=1e-5, err_msg=str(index))
    assert metric_sum(metrics, "mmserve_batch_size_sum") == NUM_TEXTS + NUM_IMAGES
    counted = sum(float(value) for value in re.findall(r'^mmserve_requests_total\{[^}]*code="200"[^}]*\} (\S+)$',
                                                         metrics, re.M))
    assert counted == NUM_TEXTS + NUM_IMAGES
