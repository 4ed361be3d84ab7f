"""The segment cache on a live server: hits, single-flight, bypass, metrics, clearing."""

from __future__ import annotations

import asyncio
import base64

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from encoded_images import encoded_image_b64

import server.ingest.inputs


def png(seed: int) -> str:
    return encoded_image_b64(seed, (40, 48))


def cache_events(client: httpx.Client) -> dict[tuple[str, str], float]:
    events = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "mmserve_cache_events_total":
                events[(sample.labels["modality"], sample.labels["event"])] = sample.value
    return events


def router_of(server):
    """Where the encoder counters live (summed over the executors)."""
    return server.app.state.mmserve.router


def test_a_repeated_image_with_a_new_text_hits_and_equals_the_uncached_answer(live_server_factory, monkeypatch):
    decodes = []
    real_decode = server.ingest.inputs.decode_image
    monkeypatch.setattr(server.ingest.inputs, "decode_image", lambda *a, **k: decodes.append(1) or real_decode(*a, **k))
    image = png(1)
    with live_server_factory() as live, live.client() as client:
        first = client.post("/v1/infer", json={"text": "what colour is it?", "image": {"b64": image}}).json()
        images_before = router_of(live).num_images_encoded
        second = client.post("/v1/infer", json={"text": "how many are there?", "image": {"b64": image}}).json()
        uncached = client.post("/v1/infer", json={"text": "how many are there?", "image": {"b64": image},
                                                  "use_cache": False}).json()
        assert router_of(live).num_images_encoded == images_before + 1  # only the uncached one
    assert first["cache"] == {"image": "miss", "text": "miss"}
    assert second["cache"] == {"image": "hit", "text": "miss"}
    assert uncached["cache"] == {"image": "bypass", "text": "bypass"}
    assert len(decodes) == 2, "a hit must skip decoding the image"
    np.testing.assert_allclose(second["fused_embedding"], uncached["fused_embedding"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(second["image_embedding"], first["image_embedding"], rtol=0, atol=0)


def test_a_repeated_text_with_a_new_image_hits_the_text_segment(tiny_server):
    with tiny_server.client() as client:
        client.post("/v1/infer", json={"text": "the same prompt for every image", "image": {"b64": png(2)}})
        again = client.post("/v1/infer", json={"text": "the same prompt for every image",
                                               "image": {"b64": png(3)}}).json()
        fresh = client.post("/v1/infer", json={"text": "the same prompt for every image",
                                               "image": {"b64": png(3)}, "use_cache": False}).json()
    assert again["cache"] == {"image": "miss", "text": "hit"}
    np.testing.assert_allclose(again["fused_embedding"], fresh["fused_embedding"], rtol=0, atol=1e-5)


def test_sixteen_concurrent_requests_with_one_new_image_encode_it_once(live_server_factory):
    image = png(4)

    async def burst(url: str) -> list[dict]:
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=16)) as c:
            responses = await asyncio.gather(*(
                c.post("/v1/infer", json={"text": f"question {i}", "image": {"b64": image}}) for i in range(16)))
        assert all(r.status_code == 200 for r in responses)
        return [r.json() for r in responses]

    with live_server_factory(max_queue_delay_ms=20) as live, live.client() as client:
        before = router_of(live).num_images_encoded
        answers = asyncio.run(burst(live.url))
        assert router_of(live).num_images_encoded == before + 1
        events = cache_events(client)
    statuses = [a["cache"]["image"] for a in answers]
    assert statuses.count("miss") == 1
    assert set(statuses) <= {"miss", "coalesced", "hit"}
    assert events[("image", "miss")] == 1
    assert events.get(("image", "coalesced"), 0) + events.get(("image", "hit"), 0) == 15
    embeddings = {tuple(a["image_embedding"]) for a in answers}
    assert len(embeddings) == 1


def test_bypass_writes_nothing_and_clearing_empties_the_cache(live_server_factory):
    with live_server_factory() as live, live.client() as client:
        image = png(5)
        client.post("/v1/infer", json={"image": {"b64": image}, "use_cache": False})
        assert client.post("/v1/infer", json={"image": {"b64": image}}).json()["cache"] == {"image": "miss"}
        assert client.post("/v1/infer", json={"image": {"b64": image}}).json()["cache"] == {"image": "hit"}
        metrics = client.get("/metrics").text
        assert 'mmserve_cache_entries{modality="image"} 1.0' in metrics
        assert client.delete("/v1/cache").json() == {"cleared_entries": 1}
        assert client.post("/v1/infer", json={"image": {"b64": image}}).json()["cache"] == {"image": "miss"}


def test_a_cache_budget_of_zero_turns_the_modality_off(live_server_factory):
    with live_server_factory(cache_image_bytes=0) as live, live.client() as client:
        image = png(6)
        for _ in range(2):
            answer = client.post("/v1/infer", json={"text": "t", "image": {"b64": image}}).json()
            assert answer["cache"]["image"] == "bypass"
        assert answer["cache"]["text"] == "hit"


def test_a_bad_image_does_not_leave_a_claim_behind(tiny_server):
    """The claim taken before decoding is handed back, so the next request is not stuck."""
    broken = base64.b64encode(base64.b64decode(png(7))[:80]).decode()
    with tiny_server.client() as client:
        for _ in range(2):
            response = client.post("/v1/infer", json={"image": {"b64": broken}})
            assert response.status_code == 400 and response.json()["error"]["code"] == "corrupt_image"
        assert tiny_server.app.state.mmserve.router.cache.num_in_flight == 0
