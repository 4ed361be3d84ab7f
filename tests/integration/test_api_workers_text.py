"""``--api-workers 2`` tokenizes and applies the joint-token budget in its API processes, as one process does.

Both servers run the tiny model (17 tokens per image, 64 per text) with a
joint-token budget of 60, so one image leaves 43 tokens for a text, and with
the test hooks (``api_workers_hooks``): every tokenizing call takes 50 ms
longer and is logged with its process id, as is every raw array turned into
the model's input and every image decoded. Each refusal, answer and cache
status at N=2 is compared with the single process's for the same request.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from encoded_images import b64, encoded_image
from tests.integration.same_answers import assert_same
from tests.integration.work_logs import Logged, send_until_both_api_processes_worked, serve_logged_side_by_side

TINY = ["--preset", "tiny", "--device", "cpu"]
MAX_JOINT_TOKENS = 60
TOKENIZE_DELAY_S = 0.05


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[list[Logged]]:
    """The ``--api-workers 2`` server and the one-process server, started side by side."""
    env = {"MMSERVE_MAX_JOINT_TOKENS": str(MAX_JOINT_TOKENS), "MMSERVE_TEST_TOKENIZE_DELAY_S": str(TOKENIZE_DELAY_S)}
    with serve_logged_side_by_side([(tmp_path_factory.mktemp("work"), [*TINY, "--api-workers", "2"], env),
                                    (tmp_path_factory.mktemp("work"), TINY, env)]) as both:
        yield both


@pytest.fixture(scope="module")
def workers(servers) -> Logged:
    return servers[0]


@pytest.fixture(scope="module")
def single(servers) -> Logged:
    return servers[1]


def image(seed: int) -> dict:
    return {"b64": b64(encoded_image(seed, (48, 40), "JPEG"))}


BROKEN_PNG = encoded_image(9, (32, 32), "PNG")[:60]  # a readable header, no pixels: refused when decoded
OVER_THE_TOKENIZER = "word " * 20  # 102 tokens, over the 64 of the tiny text encoder
OVER_BESIDE_ONE_IMAGE = "x" * 50  # 52 tokens + 17 for the image = 69, over 60

NATIVE_REFUSALS = {
    "a text over the tokenizer's limit": {"text": OVER_THE_TOKENIZER},
    "an empty text": {"text": ""},
    "a blank text beside an image": {"text": "   ", "image": image(1)},
    "a text over the joint budget beside an image": {"text": OVER_BESIDE_ONE_IMAGE, "image": image(1)},
    "a text over the joint budget beside two images": {"text": "x" * 30, "images": [image(1), image(2)]},
    "over the budget beside a broken image: the budget answers": {
        "text": OVER_BESIDE_ONE_IMAGE, "images": [image(1), {"b64": b64(BROKEN_PNG)}]},
    "over the tokenizer beside a broken image": {"text": OVER_THE_TOKENIZER, "image": {"b64": b64(BROKEN_PNG)}},
}

ROW_REFUSALS = {
    "openai: the second text over the tokenizer": (
        "/v1/embeddings", {"model": "tiny", "input": ["fine", OVER_THE_TOKENIZER]}),
    "openai: a broken image before a text over the tokenizer: the image answers": (
        "/v1/embeddings", {"model": "tiny", "input": ["data:image/png;base64," + b64(BROKEN_PNG), OVER_THE_TOKENIZER]}),
    "openai: a text over the tokenizer before a broken image": (
        "/v1/embeddings", {"model": "tiny", "input": [OVER_THE_TOKENIZER, "data:image/png;base64," + b64(BROKEN_PNG)]}),
    "kserve v2: the second row's text over the joint budget": (
        "/v2/models/tiny/infer", {"inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["fine", OVER_BESIDE_ONE_IMAGE]},
            {"name": "image", "datatype": "BYTES", "shape": [2], "data": [image(3)["b64"], image(4)["b64"]]}]}),
}


def post(served: Logged, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{served.url}{path}", json=body, headers={"Connection": "close"}, timeout=60)


@pytest.mark.parametrize("name", sorted(NATIVE_REFUSALS))
def test_a_refused_text_gets_the_single_process_answer(workers, single, name):
    body = NATIVE_REFUSALS[name]
    ours, theirs = post(workers, "/v1/infer", body), post(single, "/v1/infer", body)
    assert 400 <= theirs.status_code < 500, theirs.text
    assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json())


@pytest.mark.parametrize("name", sorted(ROW_REFUSALS))
def test_a_refused_row_gets_the_single_process_answer(workers, single, name):
    path, body = ROW_REFUSALS[name]
    ours, theirs = post(workers, path, body), post(single, path, body)
    assert 400 <= theirs.status_code < 500, theirs.text
    assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json())


def test_the_joint_budget_refuses_with_its_numbers(workers):
    """The refusals above are the budget's own, not a parse error both servers happen to share."""
    answer = post(workers, "/v1/infer", NATIVE_REFUSALS["a text over the joint budget beside an image"])
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert (error["code"], error["field"]) == ("joint_tokens_exceeded", "text")
    expected = f"1 images x 17 tokens + 52 text tokens = 69 joint tokens; the limit is {MAX_JOINT_TOKENS}"
    assert expected in error["message"]
    assert post(workers, "/v1/infer", {"text": OVER_THE_TOKENIZER}).json()["error"]["code"] == "text_too_long"


@pytest.mark.parametrize("body", [
    {"image": image(5), "text": "a photo of a cat"},
    {"image": image(6), "text": OVER_BESIDE_ONE_IMAGE, "truncate": True},
    {"images": [image(7), image(8)], "text": OVER_THE_TOKENIZER, "truncate": True},
    {"text": OVER_THE_TOKENIZER, "truncate": True},
], ids=["fusion", "fusion cut to the budget", "two images cut to the budget", "text cut to the tokenizer"])
def test_an_answered_text_equals_the_single_process(workers, single, body):
    ours, theirs = post(workers, "/v1/infer", body), post(single, "/v1/infer", body)
    assert ours.status_code == theirs.status_code == 200, ours.text
    ours_json, theirs_json = ours.json(), theirs.json()
    for answer in (ours_json, theirs_json):
        answer.pop("id"), answer.pop("timings_ms")
    assert_same(ours_json, theirs_json)
    if body.get("truncate"):
        assert ours_json["text"]["truncated"] is True


def test_texts_are_tokenized_once_and_only_in_an_api_process(workers):
    api_processes, engine = workers.children("api_process"), workers.children("engine_process")
    assert len(api_processes) == 2 and len(engine) == 1
    workers.tokenize_log.write_text("")
    workers.decode_log.write_text("")

    def send(index: int) -> None:  # new connections: either API process answers each
        seed = 20 + index
        assert post(workers, "/v1/infer", {"text": f"text number {seed}"}).status_code == 200
        assert post(workers, "/v1/infer", {"text": f"caption {seed}", "image": image(seed)}).status_code == 200

    num_texts = 2 * send_until_both_api_processes_worked(send, workers.tokenize_log, at_least=10)
    refused = post(workers, "/v1/infer", {"text": OVER_BESIDE_ONE_IMAGE, "image": image(40)})
    assert refused.status_code == 422
    tokenized_by = [int(pid) for pid in workers.tokenize_log.read_text().split()]
    assert len(tokenized_by) == num_texts + 1, "each text is tokenized once, by one process"
    assert set(tokenized_by) <= api_processes, "the engine tokenizes nothing"
    assert len(set(tokenized_by)) == 2, "both API processes tokenized some"
    assert len(workers.decode_log.read_text().split()) == num_texts // 2, "the refused request's image was not decoded"


def test_the_decode_stage_counts_tokenizing_as_one_process_counts_it(workers, single):
    delay_ms = TOKENIZE_DELAY_S * 1000
    for served in (workers, single):
        for attempt in range(4):
            answer = post(served, "/v1/infer", {"text": f"a text to time, {attempt}"})
            assert answer.status_code == 200
            assert answer.json()["timings_ms"]["decode"] >= delay_ms, "tokenizing is part of the decode stage"
    time.sleep(1.5)  # every API process has written its snapshot since
    decode_p50 = 'mmserve_stage_latency_seconds{quantile="0.5",route="text",stage="decode"}'
    for served in (workers, single):
        for _ in range(3):  # whichever API process answers the scrape
            text = httpx.get(f"{served.url}/metrics", headers={"Connection": "close"}).text
            assert sample(text, decode_p50) >= TOKENIZE_DELAY_S


def test_a_repeated_raw_upload_is_a_cache_hit_as_in_one_process(workers, single):
    pixels = np.random.default_rng(77).integers(0, 256, (40, 60, 3), dtype=np.uint8)  # (H, W, 3)
    body = {"image": {"uint8": {"shape": [40, 60, 3], "b64": base64.b64encode(pixels.tobytes()).decode()}}}
    embeddings = []
    for served in (workers, single):
        served.pixels_log.write_text("")
        first = post(served, "/v1/infer", body)
        assert first.status_code == 200 and first.json()["cache"]["image"] == "miss"
        assert len(served.pixels_log.read_text().split()) == 1
        for _ in range(4):  # new connections: both API processes at N=2
            again = post(served, "/v1/infer", body)
            assert again.json()["cache"]["image"] == "hit"
            np.testing.assert_array_equal(again.json()["image_embedding"], first.json()["image_embedding"])
        assert len(served.pixels_log.read_text().split()) == 1, "a hit turns no pixels into the model's input"
        embeddings.append(first.json()["image_embedding"])
    np.testing.assert_allclose(embeddings[0], embeddings[1], rtol=1e-5, atol=1e-6)


def sample(text: str, line_start: str) -> float:
    return float(next(line for line in text.splitlines() if line.startswith(line_start)).rsplit(" ", 1)[1])

