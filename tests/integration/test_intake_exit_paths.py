"""Every way a request leaves a live server settles its segment plan, and a waiter on it never hangs.

Each test sends an *owner* (the first request for an image: it holds the
cache's claim while its decode is slowed down) and a *waiter* for the same
image sent while the owner decodes (coalesced onto the owner's claim). Then
the owner leaves by one exit path: a bad image, a passed deadline, a client
that disconnects, a draining server, or a model that raises. The waiter must
get an answer within its client timeout, and no claim may be left in flight.

The images go through the decode pool (``inline_image_max_pixels=0``): a
small image is otherwise decoded on the event loop, where the slowed decode
would hold the waiter's request too, and no waiter could arrive meanwhile.
"""

from __future__ import annotations

import base64
import time
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import server.ingest.inputs
from tests.encoded_images import encoded_image

DECODE_STALL_S = 0.6
WAITER_DELAY_S = 0.2  # the owner has planned (it holds the claim) and is still decoding
ANSWER_TIMEOUT_S = 20.0  # a waiter left hanging fails the test with a read timeout


def _body(image: bytes, **options: object) -> dict:
    return {"image": {"b64": base64.b64encode(image).decode()}, **options}


@pytest.fixture
def slow_decode(monkeypatch) -> None:
    """Every image decode takes ``DECODE_STALL_S`` first, so the owner's claim stays in flight."""
    real_decode = server.ingest.inputs.decode_image

    def stalled(*args: object, **kwargs: object):
        time.sleep(DECODE_STALL_S)
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(server.ingest.inputs, "decode_image", stalled)


def _coalesced_images(client: httpx.Client) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if (sample.name == "mmserve_cache_events_total" and sample.labels["modality"] == "image"
                    and sample.labels["event"] == "coalesced"):
                return sample.value
    return 0.0


def _in_flight(live) -> int:
    return live.app.state.mmserve.router.cache.num_in_flight


def _wait_for_no_claims(live) -> None:
    deadline = time.monotonic() + 5.0
    while _in_flight(live) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _in_flight(live) == 0, f"{_in_flight(live)} claim(s) left unresolved"


def _post(url: str, body: dict, timeout_s: float = ANSWER_TIMEOUT_S) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=timeout_s) as client:
        return client.post("/v1/infer", json=body)


def _owner_then_waiter(live, pool: ThreadPoolExecutor, owner_body: dict, waiter_body: dict,
                       *, owner_timeout_s: float = ANSWER_TIMEOUT_S) -> tuple[Future, Future]:
    owner = pool.submit(_post, live.url, owner_body, owner_timeout_s)
    time.sleep(WAITER_DELAY_S)
    waiter = pool.submit(_post, live.url, waiter_body)
    return owner, waiter


def _check_coalesced_and_settled(live, coalesced_before: float) -> None:
    with live.client() as client:
        assert _coalesced_images(client) > coalesced_before, "the waiter never waited on the owner's claim"
    _wait_for_no_claims(live)


def test_a_bad_image_fails_its_owner_and_its_waiter_without_a_hang(live_server_factory, slow_decode):
    broken = encoded_image(1)[:90]
    with live_server_factory(decode_threads=4, inline_image_max_pixels=0) as live, ThreadPoolExecutor(2) as pool:
        with live.client() as client:
            before = _coalesced_images(client)
        owner, waiter = _owner_then_waiter(live, pool, _body(broken), _body(broken))
        for answer in (owner.result(), waiter.result()):
            assert answer.status_code == 400 and answer.json()["error"]["code"] == "corrupt_image"
        _check_coalesced_and_settled(live, before)


def test_an_owner_past_its_deadline_hands_the_image_to_its_waiter(live_server_factory, slow_decode):
    image = encoded_image(2)
    with live_server_factory(decode_threads=4, inline_image_max_pixels=0) as live, ThreadPoolExecutor(2) as pool:
        with live.client() as client:
            before = _coalesced_images(client)
        owner, waiter = _owner_then_waiter(live, pool, _body(image, timeout_ms=100), _body(image, text="late"))
        assert owner.result().status_code == 504
        assert owner.result().json()["error"]["code"] == "deadline_exceeded"
        answer = waiter.result()
        assert answer.status_code == 200, answer.text
        assert answer.json()["route"] == "fusion" and len(answer.json()["image_embedding"]) > 0
        assert answer.json()["cache"]["image"] == "miss"  # the waiter owned the image in the end
        _check_coalesced_and_settled(live, before)


def test_an_owner_whose_client_disconnects_hands_the_image_to_its_waiter(live_server_factory, slow_decode):
    image = encoded_image(3)
    with live_server_factory(decode_threads=4, inline_image_max_pixels=0) as live, ThreadPoolExecutor(2) as pool:
        with live.client() as client:
            before = _coalesced_images(client)
        # The owner's client gives up while its image still decodes, and closes the connection.
        owner, waiter = _owner_then_waiter(live, pool, _body(image), _body(image), owner_timeout_s=0.35)
        with pytest.raises(httpx.ReadTimeout):
            owner.result()
        answer = waiter.result()
        assert answer.status_code == 200, answer.text
        assert answer.json()["cache"]["image"] == "miss"
        _check_coalesced_and_settled(live, before)


def test_a_draining_server_answers_owner_and_waiter_and_keeps_no_claim(live_server_factory, slow_decode):
    image = encoded_image(4)
    with live_server_factory(decode_threads=4, inline_image_max_pixels=0) as live, ThreadPoolExecutor(2) as pool:
        with live.client() as client:
            before = _coalesced_images(client)
        owner, waiter = _owner_then_waiter(live, pool, _body(image), _body(image))
        time.sleep(0.1)
        live.app.state.mmserve.router.begin_drain()  # what SIGTERM starts; the decode is still running
        for answer in (owner.result(), waiter.result()):
            assert answer.status_code == 503 and answer.json()["error"]["code"] == "shutting_down"
        _check_coalesced_and_settled(live, before)


def test_a_model_error_reaches_owner_and_waiter_and_keeps_no_claim(live_server_factory, slow_decode, tiny_bundle,
                                                                   monkeypatch):
    image = encoded_image(5)
    with live_server_factory(decode_threads=4, inline_image_max_pixels=0) as live, ThreadPoolExecutor(2) as pool:
        with live.client() as client:
            before = _coalesced_images(client)

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("the vision encoder broke")

        monkeypatch.setattr(tiny_bundle.model, "encode_images", broken)  # after warm-up: only these requests see it
        owner, waiter = _owner_then_waiter(live, pool, _body(image), _body(image))
        for answer in (owner.result(), waiter.result()):
            assert answer.status_code == 500 and answer.json()["error"]["code"] == "inference_failed"
        monkeypatch.undo()
        _check_coalesced_and_settled(live, before)
