"""Lanes, batching, admission, deadlines, cancellation and error isolation on a live server."""

from __future__ import annotations

import asyncio
import base64
import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.request import Route


def metric_samples(client: httpx.Client, name: str) -> dict[tuple, float]:
    samples = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name:
                samples[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


async def post_many(url: str, bodies: list[dict], timeout_s: float = 60.0) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s,
                                 limits=httpx.Limits(max_connections=len(bodies))) as client:
        return await asyncio.gather(*(client.post("/v1/infer", json=body) for body in bodies))


def computed_items(server) -> int:
    return server.app.state.mmserve.router.num_computed_items


def delay_text(client: httpx.Client, delay_ms: float, duration_s: float = 60.0) -> None:
    response = client.post("/v1/admin/faults", json={"stage": "text", "delay_ms": delay_ms, "fraction": 1.0,
                                                     "duration_s": duration_s})
    assert response.status_code == 200, response.text


def test_concurrent_requests_are_batched(live_server_factory):
    with live_server_factory(max_queue_delay_ms=50) as server, server.client() as client:
        responses = asyncio.run(post_many(server.url, [{"text": f"batch me {i}"} for i in range(16)]))
        assert all(r.status_code == 200 for r in responses)
        sums = metric_samples(client, "mmserve_batch_size_sum")
        counts = metric_samples(client, "mmserve_batch_size_count")
    key = (("lane", "text"),)
    assert sums[key] == 16
    assert sums[key] / counts[key] > 1, "requests were not batched"


def test_a_full_queue_sheds_with_503_and_retry_after_and_nothing_else_fails(live_server_factory):
    with live_server_factory(max_queue_size=4, max_batch_size=2, enable_fault_injection=True) as server, \
            server.client() as client:
        delay_text(client, 100)
        responses = asyncio.run(post_many(server.url, [{"text": f"shed {i}"} for i in range(64)]))
        shed = [r for r in responses if r.status_code == 503]
        served = [r for r in responses if r.status_code == 200]
        rejected = metric_samples(client, "mmserve_rejected_total")
    assert len(shed) + len(served) == 64, sorted({r.status_code for r in responses})
    assert shed and served
    for response in shed:
        assert response.json()["error"]["code"] == "overloaded"
        assert int(response.headers["Retry-After"]) >= 1
    assert sum(v for k, v in rejected.items() if ("lane", "text") in k) == len(shed)


def test_an_expired_request_is_answered_504_and_never_computed(live_server_factory):
    with live_server_factory(max_batch_size=1, enable_fault_injection=True) as server, server.client() as client:
        delay_text(client, 400)
        before = computed_items(server)

        async def scenario():
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as async_client:
                blocker = asyncio.create_task(async_client.post("/v1/infer", json={"text": "occupies the device"}))
                await asyncio.sleep(0.1)
                expiring = await async_client.post("/v1/infer", json={"text": "too late", "timeout_ms": 150})
                return await blocker, expiring

        blocker, expiring = asyncio.run(scenario())
        assert blocker.status_code == 200
        assert expiring.status_code == 504, expiring.text
        assert expiring.json()["error"]["code"] == "deadline_exceeded"
        assert computed_items(server) == before + 1


def test_a_disconnected_clients_request_is_never_computed(live_server_factory):
    with live_server_factory(max_batch_size=1, enable_fault_injection=True) as server, server.client() as client:
        delay_text(client, 400)
        before = computed_items(server)

        async def scenario():
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as async_client:
                blocker = asyncio.create_task(async_client.post("/v1/infer", json={"text": "occupies the device"}))
                await asyncio.sleep(0.1)
                with pytest.raises(httpx.ReadTimeout):
                    await async_client.post("/v1/infer", json={"text": "gives up"}, timeout=0.1)
                return await blocker

        assert asyncio.run(scenario()).status_code == 200
        time.sleep(0.6)  # long enough for the abandoned request to have run, had it been kept
        assert computed_items(server) == before + 1
        assert metric_samples(client, "mmserve_requests_total")[(("code", "499"), ("route", "text"))] == 1


def test_priorities_order_service(live_server_factory):
    with live_server_factory(max_batch_size=1, enable_fault_injection=True) as server, server.client() as client:
        delay_text(client, 150)
        finished: list[str] = []

        async def scenario():
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as async_client:
                async def send(name: str, priority: str):
                    response = await async_client.post("/v1/infer", json={"text": name, "priority": priority})
                    assert response.status_code == 200
                    finished.append(name)

                tasks = [asyncio.create_task(send("blocker", "normal"))]
                await asyncio.sleep(0.05)
                for name in ("low", "normal", "high"):
                    tasks.append(asyncio.create_task(send(name, name)))
                    await asyncio.sleep(0.02)
                await asyncio.gather(*tasks)

        asyncio.run(scenario())
    assert finished == ["blocker", "high", "normal", "low"]


class FailingModel:
    """Wraps the served model: raises for poisoned rows, or for any batch above a size."""

    def __init__(self, model, *, poison_token: int | None = None, fail_batches_over: int | None = None):
        self._model = model
        self._poison_token = poison_token
        self._fail_batches_over = fail_batches_over

    def __getattr__(self, name):
        return getattr(self._model, name)

    def encode_texts(self, token_ids, **kwargs):
        if self._poison_token is not None and any(self._poison_token in ids for ids in token_ids):
            raise RuntimeError("a bad row")
        real_rows = len({tuple(ids) for ids in token_ids})
        if self._fail_batches_over is not None and real_rows > self._fail_batches_over:
            raise RuntimeError("out of memory (simulated)")
        return self._model.encode_texts(token_ids, **kwargs)


def _run_batch_of_eight(server, texts: list[str]) -> list[httpx.Response]:
    return asyncio.run(post_many(server.url, [{"text": text} for text in texts]))


def test_one_poisoned_item_fails_alone(live_server_factory, tiny_bundle):
    poison_token = tiny_bundle.tokenizer.encode("~", truncate=False).token_ids[1]
    with live_server_factory(max_queue_delay_ms=100) as server, server.client() as client:
        runner = server.app.state.mmserve.router.executor_for(Route.TEXT).runner
        runner.model = FailingModel(runner.model, poison_token=poison_token)
        texts = [f"healthy {i}" for i in range(7)] + ["poisoned ~"]
        responses = _run_batch_of_eight(server, texts)
        sizes = metric_samples(client, "mmserve_batch_size_count")
    by_text = dict(zip(texts, responses))
    assert by_text["poisoned ~"].status_code == 500
    assert by_text["poisoned ~"].json()["error"]["code"] == "inference_failed"
    assert "error id" in by_text["poisoned ~"].json()["error"]["message"]
    assert all(by_text[t].status_code == 200 for t in texts[:7])
    assert sizes[(("lane", "text"),)] < 8, "the eight requests were not batched together"


def test_a_batch_level_failure_is_split_and_healthy_items_succeed(live_server_factory):
    with live_server_factory(max_queue_delay_ms=100) as server:
        runner = server.app.state.mmserve.router.executor_for(Route.TEXT).runner
        runner.model = FailingModel(runner.model, fail_batches_over=2)
        responses = _run_batch_of_eight(server, [f"split me {i}" for i in range(8)])
    assert [r.status_code for r in responses] == [200] * 8


def test_the_default_deadline_counts_from_arrival_not_from_the_queue(live_server_factory):
    """Time spent decoding counts against a request's default timeout too."""
    with live_server_factory(enable_fault_injection=True, text_default_timeout_ms=200) as server, \
            server.client() as client:
        before = computed_items(server)
        client.post("/v1/admin/faults", json={"stage": "decode", "delay_ms": 300, "duration_s": 30})
        late = client.post("/v1/infer", json={"text": "slow to decode"})
        assert late.status_code == 504 and late.json()["error"]["code"] == "deadline_exceeded"
        client.delete("/v1/admin/faults")
        assert client.post("/v1/infer", json={"text": "fast again"}).status_code == 200
        assert computed_items(server) == before + 1


def test_vision_and_fusion_requests_share_one_image_batch_and_keep_their_answers(live_server_factory):
    """Queued together, 3 vision and 3 fusion requests run one encoder pass; each answer equals its solo answer."""
    images = [{"uint8": {"shape": [8, 8, 3], "b64": base64.b64encode(bytes([(17 * i + j) % 256 for j in range(192)])).decode()}}
              for i in range(6)]
    bodies = ([{"image": images[i]} for i in range(3)]
              + [{"image": images[i], "text": f"what is in picture {i}"} for i in range(3, 6)])
    with live_server_factory(max_queue_delay_ms=400, cache_image_bytes=0, cache_text_bytes=0) as server, \
            server.client() as client:
        together = asyncio.run(post_many(server.url, bodies))
        image_batches = metric_samples(client, "mmserve_batch_size_count")
        solo = [client.post("/v1/infer", json=body) for body in bodies]
    assert [r.status_code for r in together] == [200] * 6, [r.text for r in together]
    assert [r.json()["route"] for r in together] == ["vision"] * 3 + ["fusion"] * 3
    assert image_batches.get((("lane", "vision"),), 0) + image_batches.get((("lane", "fusion"),), 0) == 1
    for mixed, alone in zip(together, solo, strict=True):
        for key in ("image_embedding", "text_embedding", "fused_embedding", "score"):
            assert (mixed.json().get(key) is None) == (alone.json().get(key) is None)
            if alone.json().get(key) is not None:
                np.testing.assert_allclose(mixed.json()[key], alone.json()[key], rtol=0, atol=1e-5)
