"""Several images in one request on a live server: answers, per-image cache segments, budgets, bad input."""

from __future__ import annotations

import asyncio
import io

import httpx
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoModel, SiglipImageProcessorPil

from benchmarks.random_pretrained import write_siglip
from server.settings import Settings
from tests.encoded_images import b64, encoded_image, encoded_image_b64

ATOL = 1e-5


def _images(*seeds: int) -> list[dict]:
    return [{"b64": encoded_image_b64(seed, (48, 40))} for seed in seeds]


def test_each_image_gets_its_own_embedding_equal_to_sending_it_alone(tiny_server):
    with tiny_server.client() as client:
        many = client.post("/v1/infer", json={"images": _images(11, 12, 13), "use_cache": False})
        assert many.status_code == 200, many.text
        alone = [client.post("/v1/infer", json={"image": image, "use_cache": False}).json()
                 for image in _images(11, 12, 13)]
    body = many.json()
    assert body["route"] == "vision"
    assert "image_embedding" not in body and len(body["image_embeddings"]) == 3
    for got, single in zip(body["image_embeddings"], alone, strict=True):
        np.testing.assert_allclose(got, single["image_embedding"], rtol=0, atol=ATOL)
    assert body["cache"] == {"images": ["bypass"] * 3}


def test_a_fused_request_over_three_images_answers_the_same_alone_and_inside_a_batch(live_server_factory):
    request = {"text": "three pictures of a harbour", "images": _images(21, 22, 23), "use_cache": False}
    others = [{"text": f"another caption {i}", "images": _images(30 + i), "use_cache": False} for i in range(5)]
    with live_server_factory(max_queue_delay_ms=200) as server:
        with server.client() as client:
            alone = client.post("/v1/infer", json=request).json()

        async def together() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                return await asyncio.gather(*(client.post("/v1/infer", json=body) for body in [request, *others]))

        answers = asyncio.run(together())
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    batched = answers[0].json()
    assert batched["route"] == "fusion" and len(batched["image_embeddings"]) == 3
    assert batched["joint_tokens"]["num_images"] == 3
    assert batched["joint_tokens"]["total"] == 3 * batched["joint_tokens"]["tokens_per_image"] + batched["text"]["num_tokens"]
    np.testing.assert_allclose(batched["fused_embedding"], alone["fused_embedding"], rtol=0, atol=ATOL)
    # The fused answer depends on every image: swap one and it moves.
    assert not np.allclose(answers[1].json()["fused_embedding"], batched["fused_embedding"], atol=1e-3)


def test_an_image_shared_by_two_requests_is_encoded_once_and_all_cached_runs_in_the_text_lane(live_server_factory):
    shared, first_only, second_only = _images(41, 42, 43)
    with live_server_factory() as server, server.client() as client:
        router = server.app.state.mmserve.router
        first = client.post("/v1/infer", json={"text": "a catalogue item", "images": [shared, first_only]}).json()
        encoded_after_first = router.num_images_encoded
        second = client.post("/v1/infer", json={"text": "a catalogue item", "images": [second_only, shared]}).json()
        encoded_after_second = router.num_images_encoded
        third = client.post("/v1/infer", json={"text": "is it blue?", "images": [shared, second_only]}).json()
        encoded_after_third = router.num_images_encoded
    assert first["cache"]["images"] == ["miss", "miss"]
    assert second["cache"]["images"] == ["miss", "hit"]
    assert encoded_after_second - encoded_after_first == 1  # only the new one
    np.testing.assert_allclose(second["image_embeddings"][1], first["image_embeddings"][0], rtol=0, atol=0)
    assert third["cache"]["images"] == ["hit", "hit"] and encoded_after_third == encoded_after_second
    assert "vision" not in third["timings_ms"]  # nothing was encoded: it ran in the text lane


def test_too_many_images_and_an_empty_list_are_refused_naming_the_field(live_server_factory):
    with live_server_factory(max_images_per_request=2) as server, server.client() as client:
        too_many = client.post("/v1/infer", json={"text": "x", "images": _images(1, 2, 3)})
        empty = client.post("/v1/infer", json={"text": "x", "images": []})
        both = client.post("/v1/infer", json={"image": _images(1)[0], "images": _images(2)})
        parts = [("image", (f"{i}.png", encoded_image(i), "image/png")) for i in range(3)]
        multipart = client.post("/v1/infer", files=parts)
        assert client.get("/health/live").status_code == 200
    assert too_many.status_code == 422 and too_many.json()["error"]["code"] == "too_many_images"
    assert too_many.json()["error"]["field"] == "images" and "limit is 2" in too_many.json()["error"]["message"]
    assert empty.status_code == 422 and empty.json()["error"]["field"] == "images"
    assert both.status_code == 422 and both.json()["error"]["field"] == "images"
    assert multipart.status_code == 422 and multipart.json()["error"]["code"] == "too_many_images", multipart.text


def test_one_undecodable_image_among_three_fails_its_request_by_index_and_spares_the_batch(live_server_factory):
    bad = {"text": "a caption", "images": [_images(51)[0], {"b64": "bm90IGFuIGltYWdl"}, _images(52)[0]]}
    good = [{"text": f"caption {i}", "images": _images(60 + i, 70 + i)} for i in range(3)]
    with live_server_factory(max_queue_delay_ms=100) as server:

        async def together() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                return await asyncio.gather(*(client.post("/v1/infer", json=body) for body in [bad, *good]))

        answers = asyncio.run(together())
        assert server.app.state.mmserve.router.cache.num_in_flight == 0  # the bad request's claims were settled
    error = answers[0].json()["error"]
    assert answers[0].status_code == 415 and error["field"] == "images[1]", error
    assert error["message"].startswith("images[1]:")
    assert [a.status_code for a in answers[1:]] == [200, 200, 200]


def test_the_joint_token_budget_refuses_or_cuts_the_text_and_says_so(live_server_factory, tiny_bundle):
    tokens_per_image = tiny_bundle.model.vision.num_tokens
    limit = 2 * tokens_per_image + 8
    text = "a description of two pictures"  # under the text limit (64), over what two images leave
    with live_server_factory(max_joint_tokens=limit) as server, server.client() as client:
        refused = client.post("/v1/infer", json={"text": text, "images": _images(81, 82)})
        cut = client.post("/v1/infer", json={"text": text, "images": _images(81, 82), "truncate": True})
        one_image = client.post("/v1/infer", json={"text": "short", "images": _images(81)})
        metrics = client.get("/metrics").text
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "joint_tokens_exceeded" and error["field"] == "text"
    assert f"2 images x {tokens_per_image} tokens" in error["message"] and f"limit is {limit}" in error["message"]
    assert cut.status_code == 200, cut.text
    body = cut.json()
    assert body["text"]["truncated"] is True and body["text"]["num_tokens"] == 8
    assert body["joint_tokens"] == {"num_images": 2, "tokens_per_image": tokens_per_image, "num_text_tokens": 8,
                                    "total": limit, "limit": limit}
    assert one_image.status_code == 200 and one_image.json()["joint_tokens"]["total"] < limit
    counts = {sample.labels["route"]: sample.value
              for family in text_string_to_metric_families(metrics) for sample in family.samples
              if sample.name == "mmserve_joint_tokens_count"}
    assert counts.get("fusion") == 2.0, counts  # the answered ones


def test_multipart_takes_several_image_parts_in_order(tiny_server):
    parts = [("image", (f"{seed}.png", encoded_image(seed, (48, 40)), "image/png")) for seed in (91, 92)]
    with tiny_server.client() as client:
        many = client.post("/v1/infer", files=parts, data={"text": "two photos", "use_cache": "false"})
        as_json = client.post("/v1/infer", json={"text": "two photos", "images": _images(91, 92),
                                                 "use_cache": False})
    assert many.status_code == 200, many.text
    assert len(many.json()["image_embeddings"]) == 2
    np.testing.assert_allclose(many.json()["fused_embedding"], as_json.json()["fused_embedding"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(many.json()["image_embeddings"], as_json.json()["image_embeddings"], rtol=0, atol=ATOL)


def test_the_seed_workload_three_large_images_and_200_cjk_characters_through_siglip(tmp_path, live_server_runner):
    """3 images of 1024x768 + 200 Chinese characters, through a SigLIP checked against transformers per image."""
    directory = write_siglip(tmp_path / "tiny-siglip")
    cjk_200 = ("一只猫坐在窗台上两只狗在草地上玩耍桌子上有一碗水果夜晚的城市天际线" * 7)[:200]
    images = [encoded_image(100 + i, (1024, 768), "JPEG", quality=90) for i in range(3)]
    model = AutoModel.from_pretrained(str(directory)).eval()
    processor = SiglipImageProcessorPil.from_pretrained(str(directory))
    with torch.no_grad():
        pixels = processor(images=[Image.open(io.BytesIO(data)).convert("RGB") for data in images],
                           return_tensors="pt")
        want = F.normalize(model.get_image_features(**pixels).pooler_output, dim=-1)  # (3, E)
    body = {"text": cjk_200, "images": [{"b64": b64(data)} for data in images]}
    with live_server_runner(Settings(model=str(directory), device="cpu")) as server, server.client() as client:
        answer = client.post("/v1/infer", json=body)
    assert answer.status_code == 200, answer.text
    answer = answer.json()
    assert answer["route"] == "fusion" and len(answer["image_embeddings"]) == 3
    np.testing.assert_allclose(answer["image_embeddings"], want.numpy(), rtol=0, atol=ATOL)
    assert answer["text"]["truncated"] is True  # SigLIP cuts at its length, as its pipeline does
    joint = answer["joint_tokens"]
    assert joint["num_images"] == 3 and joint["total"] == 3 * joint["tokens_per_image"] + answer["text"]["num_tokens"]
    assert "score" in answer and 0.0 < answer["score"] < 1.0  # SigLIP's sigmoid: the best of the three
