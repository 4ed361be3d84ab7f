"""With the image cache off, an API process does not ask the engine which images it holds.

Nothing can be held there, so the peek would be a round trip to the engine
per image request for a known answer. A cache-on server beside it shows the
hook counts the peeks it does make.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from encoded_images import b64, encoded_image
from tests.conftest import run_serve_process

HOOKS = str(Path(__file__).parent / "api_workers_hooks")


def serve_counting_peeks(tmp_path_factory, cache_image_bytes: int) -> Iterator[tuple[str, Path]]:
    peek_log = tmp_path_factory.mktemp("peeks") / "peek.log"
    peek_log.write_text("")
    env = {"PYTHONPATH": os.pathsep.join([HOOKS, os.environ.get("PYTHONPATH", "")]),
           "MMSERVE_TEST_PEEK_LOG": str(peek_log), "MMSERVE_CACHE_IMAGE_BYTES": str(cache_image_bytes)}
    with run_serve_process(["--preset", "tiny", "--device", "cpu", "--api-workers", "2"], env) as served:
        yield served.url, peek_log


@pytest.fixture(scope="module")
def cache_off(tmp_path_factory):
    yield from serve_counting_peeks(tmp_path_factory, 0)


@pytest.fixture(scope="module")
def cache_on(tmp_path_factory):
    yield from serve_counting_peeks(tmp_path_factory, 8 * 1024 * 1024)


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
