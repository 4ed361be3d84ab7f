"""``--api-workers 2`` with the cache off: no peeks at the engine, and every answered request batched once.

With the image cache off, an API process does not ask the engine which
images it holds: nothing can be held there, so the peek would be a round
trip to the engine per image request for a known answer. A cache-on server
beside it shows the hook counts the peeks it does make.

The API processes send a turn's calls and latency records to the engine in one
frame, and the engine answers a turn's calls in one frame
(``server.workers.frames.CorkedFrameWriter``): many requests share a frame
both ways. With no cache (text and image) every request runs in a tower batch,
so the batch-size histogram's sum (requests in batches, by lane) must grow by
the requests answered, and each answer must be its own request's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from encoded_images import b64, encoded_image, encoded_image_b64
from tests.conftest import run_serve_processes

HOOKS = str(Path(__file__).parent / "api_workers_hooks")


NUM_TEXTS, NUM_IMAGES = 96, 32


def _counting_peeks(tmp_path_factory, cache_bytes: int) -> tuple[list[str], dict[str, str], Path]:
    peek_log = tmp_path_factory.mktemp("peeks") / "peek.log"
    peek_log.write_text("")
    env = {"PYTHONPATH": os.pathsep.join([HOOKS, os.environ.get("PYTHONPATH", "")]),
           "MMSERVE_TEST_PEEK_LOG": str(peek_log), "MMSERVE_CACHE_IMAGE_BYTES": str(cache_bytes)}
    if cache_bytes == 0:
        env["MMSERVE_CACHE_TEXT_BYTES"] = "0"  # the text cache off too: every request runs in a batch
    return ["--preset", "tiny", "--device", "cpu", "--api-workers", "2"], env, peek_log


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, tuple[str, Path]]]:
    """The cache-off and the cache-on server (each logging its peeks), started side by side."""
    off_args, off_env, off_peeks = _counting_peeks(tmp_path_factory, 0)
    on_args, on_env, on_peeks = _counting_peeks(tmp_path_factory, 8 * 1024 * 1024)
    with run_serve_processes([(off_args, off_env), (on_args, on_env)], ready_timeout_s=150) as (off, on):
        yield {"off": (off.url, off_peeks), "on": (on.url, on_peeks)}


@pytest.fixture(scope="module")
def cache_off(servers):
    return servers["off"]


@pytest.fixture(scope="module")
def cache_on(servers):
    return servers["on"]


def metric_sum(text: str, name: str) -> float:
    return sum(float(value) for value in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def answered_total(metrics: str) -> float:
    return sum(float(value) for value in re.findall(r'^mmserve_requests_total\{[^}]*code="200"[^}]*\} (\S+)$',
                                                    metrics, re.M))


def post_images(url: str, num_requests: int) -> list[dict]:
    answers = []
    for seed in range(num_requests):
        answer = httpx.post(f"{url}/v1/infer", json={"image": {"b64": b64(encoded_image(seed, (48, 40), "JPEG"))}},
                            headers={"Connection": "close"}, timeout=60)
        assert answer.status_code == 200, answer.text
        answers.append(answer.json())
    return answers


def test_no_peek_with_the_image_cache_off_and_one_per_request_with_it_on(cache_off, cache_on):
    off_url, off_peeks = cache_off
    on_url, on_peeks = cache_on
    off_answers = post_images(off_url, 6)
    on_answers = post_images(on_url, 6)
    assert off_peeks.read_text() == ""
    assert len(on_peeks.read_text().split()) == 6
    for off, on in zip(off_answers, on_answers):  # the same model (seeded preset), the same embeddings
        assert off["image_embedding"] == pytest.approx(on["image_embedding"], rel=1e-5, abs=1e-6)


def test_every_answered_request_went_through_a_tower_batch_once(cache_off):
    url, _ = cache_off
    bodies = ([{"text": f"text number {index}"} for index in range(NUM_TEXTS)]
              + [{"image": {"b64": encoded_image_b64(index, (32, 24))}} for index in range(NUM_IMAGES)])

    def send(client_index: int) -> list[tuple[dict, httpx.Response]]:
        with httpx.Client(base_url=url, timeout=120) as client:  # keep-alive: one API process each
            return [(body, client.post("/v1/infer", json=body)) for body in bodies[client_index::16]]

    metrics_before = httpx.get(f"{url}/metrics", timeout=30).text  # the module's other test may have come first
    with ThreadPoolExecutor(16) as pool:  # 16 connections at once: turns with several requests
        answered = [pair for pairs in pool.map(send, range(16)) for pair in pairs]
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    alone = {index: httpx.post(f"{url}/v1/infer", json=bodies[index], timeout=60).json()
             for index in (0, 1, NUM_TEXTS - 1, NUM_TEXTS, NUM_TEXTS + NUM_IMAGES - 1)}

    assert [response.status_code for _, response in answered] == [200] * (NUM_TEXTS + NUM_IMAGES)
    for body, response in answered:
        assert response.json()["route"] == ("text" if "text" in body else "vision")
    by_body = {id(body): response.json() for body, response in answered}
    for index, answer in alone.items():  # each answer is its own request's, not a frame neighbour's
        key = "text_embedding" if index < NUM_TEXTS else "image_embedding"
        np.testing.assert_allclose(by_body[id(bodies[index])][key], answer[key], atol=1e-5, err_msg=str(index))
    batched = metric_sum(metrics, "mmserve_batch_size_sum") - metric_sum(metrics_before, "mmserve_batch_size_sum")
    assert batched == NUM_TEXTS + NUM_IMAGES
    assert answered_total(metrics) - answered_total(metrics_before) == NUM_TEXTS + NUM_IMAGES
