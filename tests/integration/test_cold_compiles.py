"""Every bucket a configured server can select runs after ready without a cold shape or compile."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.encoded_images import encoded_image_b64


def _cold_compiles(client: httpx.Client) -> dict[str, float]:
    return {sample.labels["kind"]: sample.value
            for family in text_string_to_metric_families(client.get("/metrics").text)
            for sample in family.samples if sample.name == "mmserve_cold_compiles_total"}


def test_driving_every_text_bucket_batch_size_and_image_count_after_ready_compiles_nothing(live_server_factory,
                                                                                             tiny_bundle):
    max_images = 3
    with live_server_factory(max_images_per_request=max_images, max_batch_size=4, max_queue_delay_ms=20,
                             cache_image_bytes=0, cache_text_bytes=0) as server:
        router = server.app.state.mmserve.router
        buckets = router.executors[0].runner.text_buckets
        bodies = []
        for bucket in buckets:
            text = "x" * max(1, bucket - 2)  # the byte-level tokenizer: one token a byte, plus two specials
            for num_images in range(0, max_images + 1):
                images = [{"b64": encoded_image_b64(1000 + 10 * bucket + 3 * num_images + k)}
                          for k in range(num_images)]
                bodies.append({"text": text, **({"images": images} if images else {})})
                bodies.append({"images": images} if images else {"text": text[: len(text) // 2 + 1]})

        async def burst(size: int) -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                answers = []
                for first in range(0, len(bodies), size):
                    chunk = bodies[first: first + size]
                    answers += await asyncio.gather(*(client.post("/v1/infer", json=body) for body in chunk))
                return answers

        answers = [answer for size in (1, 3, 4) for answer in asyncio.run(burst(size))]
        with server.client() as client:
            cold = _cold_compiles(client)
    assert all(answer.status_code == 200 for answer in answers), [a.text for a in answers if a.status_code != 200]
    assert cold == {"shape": 0.0, "triton_kernel": 0.0}, cold
