"""Short text-only requests are prepared on the event loop: a backed-up image decode pool does not hold them."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from encoded_images import encoded_image_b64
import server.ingest.inputs
from router.intake import INLINE_TEXT_MAX_CHARS

DECODE_STALL_S = 1.5


def _slow_decode(monkeypatch) -> None:
    real_decode = server.ingest.inputs.decode_image

    def stalled(*args, **kwargs):
        time.sleep(DECODE_STALL_S)
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(server.ingest.inputs, "decode_image", stalled)


def _latency_behind_a_stalled_decode(live, text: str) -> float:
    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=live.url, timeout=30) as client:
        image = pool.submit(client.post, "/v1/infer", json={"image": {"b64": encoded_image_b64(0, (32, 32))}})
        time.sleep(0.3)  # the only decode thread is now busy with the image
        started = time.monotonic()
        with httpx.Client(base_url=live.url, timeout=30) as other:
            answer = other.post("/v1/infer", json={"text": text, "truncate": True})
        elapsed_s = time.monotonic() - started
        assert answer.status_code == 200 and image.result().status_code == 200
    return elapsed_s


def test_a_short_text_is_answered_while_the_decode_pool_is_busy(live_server_factory, monkeypatch):
    _slow_decode(monkeypatch)
    with live_server_factory(decode_threads=1, cache_image_bytes=0, inline_image_max_pixels=0) as live:
        elapsed_s = _latency_behind_a_stalled_decode(live, "short and sweet")
    assert elapsed_s < DECODE_STALL_S / 2, f"the text waited {elapsed_s:.2f} s for the image decode"


def test_a_long_text_still_goes_through_the_pool(live_server_factory, monkeypatch):
    _slow_decode(monkeypatch)
    with live_server_factory(decode_threads=1, cache_image_bytes=0, inline_image_max_pixels=0) as live:
        elapsed_s = _latency_behind_a_stalled_decode(live, "x " * INLINE_TEXT_MAX_CHARS)
    assert elapsed_s > (DECODE_STALL_S - 0.3) * 0.8, f"the long text took only {elapsed_s:.2f} s"
