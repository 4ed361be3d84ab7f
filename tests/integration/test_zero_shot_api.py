"""``/v1/classify`` and ``/v1/rank`` on live servers answer what transformers computes, and labels are cached.

Small random SigLIP (64 text positions: the pipeline pads SigLIP texts to 64)
and CLIP directories are written with ``save_pretrained`` and served in
float32 on the CPU. The reference is transformers' own
``pipeline("zero-shot-image-classification")`` on the same image, labels and
template (classify), and the model's ``logits_per_image`` (rank).
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from transformers import (
    AutoModel, AutoTokenizer, CLIPImageProcessorPil, SiglipImageProcessorPil, pipeline,
)

from benchmarks.random_pretrained import write_clip, write_siglip
from server.settings import Settings
from tests.encoded_images import encoded_image
from tests.integration.trained_head_repository import write_tiny_with_a_trained_head

TOLERANCE = 1e-5
LABELS = ["cat", "two dogs", "a red bicycle", "bowl of fruit", "city at night", "一只猫"]
TOKENIZE = {"siglip": {"padding": "max_length", "max_length": 64, "truncation": True}, "clip": {"padding": True}}


def _b64(data: bytes) -> dict:
    return {"b64": base64.b64encode(data).decode()}


def _rgb(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("zero-shot")
    return {"siglip": write_siglip(root / "siglip", max_text_tokens=64), "clip": write_clip(root / "clip")}


@pytest.fixture(scope="module")
def servers(model_dirs):
    from tests.conftest import run_live_server

    with run_live_server(Settings(model=str(model_dirs["siglip"]), device="cpu")) as siglip, \
            run_live_server(Settings(model=str(model_dirs["clip"]), device="cpu", max_labels_per_request=8,
                                     max_candidates_per_request=4)) as clip:
        yield {"siglip": siglip, "clip": clip}


def _cache_events(client: httpx.Client) -> dict[tuple[str, str], float]:
    events = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "mmserve_cache_events_total":
                events[(sample.labels["modality"], sample.labels["event"])] = sample.value
    return events


def _requests_total(client: httpx.Client, route: str, code: str) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "mmserve_requests_total" and sample.labels == {"route": route, "code": code}:
                return sample.value
    return 0.0


# The pipeline's default image processor is transformers' torchvision backend, whose resize filters differ
# from PIL's; mmserve resizes as the PIL backend does. Images already at the processor's resize size are not
# resized, so there the default pipeline is the reference; other sizes are compared with the pipeline given
# the family's PIL processor (the same pipeline code, the PIL backend's pixels).
UNRESIZED_PX = {"siglip": (32, 32), "clip": (36, 36)}  # write_*'s TowerSize: squash to 32; shortest edge 36
PIL_PROCESSORS = {"siglip": SiglipImageProcessorPil, "clip": CLIPImageProcessorPil}


@pytest.mark.parametrize("family", ["siglip", "clip"])
@pytest.mark.parametrize(("template", "backend"), [(None, "default"), ("a picture showing {}", "default"),
                                                   (None, "pil"), ("{}", "pil")])
def test_classify_equals_the_transformers_pipeline(family, template, backend, model_dirs, servers):
    directory = model_dirs[family]
    if backend == "default":
        images = [encoded_image(11, UNRESIZED_PX[family]), encoded_image(12, UNRESIZED_PX[family])]
        classifier = pipeline("zero-shot-image-classification", model=str(directory), device="cpu")
    else:
        images = [encoded_image(11, (48, 40)), encoded_image(12, (40, 52))]
        classifier = pipeline("zero-shot-image-classification", model=str(directory), device="cpu",
                              image_processor=PIL_PROCESSORS[family].from_pretrained(str(directory)))
    options = {} if template is None else {"hypothesis_template": template}
    body = {"images": [_b64(image) for image in images], "labels": LABELS}
    if template is not None:
        body["template"] = template
    with servers[family].client() as client:
        answer = client.post("/v1/classify", json=body)
    assert answer.status_code == 200, answer.text
    answer = answer.json()
    assert answer["score_kind"] == {"siglip": "sigmoid", "clip": "softmax"}[family]
    assert answer["model"]["family"] == family
    assert len(answer["results"]) == len(images)
    for image, result in zip(images, answer["results"]):
        want = classifier(_rgb(image), candidate_labels=LABELS, **options)
        assert [entry["label"] for entry in result["labels"]] == [entry["label"] for entry in want]
        np.testing.assert_allclose([entry["score"] for entry in result["labels"]],
                                   [entry["score"] for entry in want], rtol=0, atol=TOLERANCE)
    if family == "clip":
        assert sum(entry["score"] for entry in answer["results"][0]["labels"]) == pytest.approx(1, abs=1e-5)


def test_classify_top_k_and_a_single_image_answer_the_best_first(servers):
    with servers["siglip"].client() as client:
        full = client.post("/v1/classify", json={"image": _b64(encoded_image(13)), "labels": LABELS}).json()
        top = client.post("/v1/classify", json={"image": _b64(encoded_image(13)), "labels": LABELS, "top_k": 2}).json()
    scores = [entry["score"] for entry in full["results"][0]["labels"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == len(LABELS)
    assert top["results"][0]["labels"] == full["results"][0]["labels"][:2]


def _reference_logits(directory: Path, family: str, texts: list[str], images: list[bytes]) -> np.ndarray:
    """(N images, L texts) ``logits_per_image`` of the model itself, tokenized as its pipeline tokenizes."""
    model = AutoModel.from_pretrained(str(directory)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    processor = PIL_PROCESSORS[family].from_pretrained(str(directory))  # mmserve resizes as the PIL backend
    pixels = processor(images=[_rgb(image) for image in images], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = model(pixel_values=pixels, **tokenizer(texts, return_tensors="pt", **TOKENIZE[family]))
    return out.logits_per_image.numpy()


@pytest.mark.parametrize("family", ["siglip", "clip"])
def test_rank_equals_the_models_own_scores_both_ways(family, model_dirs, servers):
    images = [encoded_image(seed, (44, 44)) for seed in (21, 22, 23)]
    texts = ["a cat", "two dogs playing", "snow on the mountains", "a blue car"]
    logits = _reference_logits(model_dirs[family], family, texts, images)  # (3, 4)
    scores = 1 / (1 + np.exp(-logits)) if family == "siglip" else logits
    with servers[family].client() as client:
        by_text = client.post("/v1/rank", json={"query": texts[1], "candidates": [_b64(i) for i in images]}).json()
        by_image = client.post("/v1/rank", json={"query": _b64(images[2]), "candidates": texts, "top_k": 3}).json()
    assert by_text["score_kind"] == by_image["score_kind"] == {"siglip": "siglip_sigmoid", "clip": "clip_logit"}[family]
    want = scores[:, 1]
    assert [r["index"] for r in by_text["results"]] == list(np.argsort(-want, kind="stable"))
    np.testing.assert_allclose([r["score"] for r in by_text["results"]], np.sort(want)[::-1], rtol=0, atol=TOLERANCE)
    want = scores[2, :]
    assert [r["index"] for r in by_image["results"]] == list(np.argsort(-want, kind="stable"))[:3]
    np.testing.assert_allclose([r["score"] for r in by_image["results"]], np.sort(want)[::-1][:3], rtol=0,
                               atol=TOLERANCE)


def test_a_second_identical_classify_encodes_no_text(servers):
    labels = [f"label number {index}" for index in range(7)] + ["label number 0"]  # a repeat is planned once
    body = {"image": _b64(encoded_image(31)), "labels": labels}
    server = servers["clip"]
    router = server.app.state.mmserve.router
    with server.client() as client:
        before = _cache_events(client)
        texts_before = router.num_texts_encoded
        first = client.post("/v1/classify", json=body).json()
        middle = _cache_events(client)
        texts_middle = router.num_texts_encoded
        second = client.post("/v1/classify", json=body).json()
        after = _cache_events(client)
    assert texts_middle - texts_before == 7  # seven distinct labels, each encoded once
    assert first["cache"]["texts"]["miss"] == 7
    assert router.num_texts_encoded == texts_middle  # the second request encoded no text
    assert second["cache"]["texts"] == {"hit": 7, "miss": 0, "coalesced": 0, "bypass": 0}
    assert after.get(("text", "miss"), 0) == middle.get(("text", "miss"), 0)
    assert after[("text", "hit")] - middle.get(("text", "hit"), 0) == 7
    assert middle.get(("text", "miss"), 0) - before.get(("text", "miss"), 0) == 7
    assert second["results"] == first["results"]
    assert [entry["label"] for entry in second["results"][0]["labels"]].count("label number 0") == 2


def test_concurrent_classifies_with_the_same_new_labels_encode_each_once(servers):
    import concurrent.futures

    labels = [f"shared new label {index}" for index in range(6)]
    server = servers["clip"]
    router = server.app.state.mmserve.router
    before = router.num_texts_encoded

    def classify(seed: int) -> dict:
        with server.client() as client:
            return client.post("/v1/classify", json={"image": _b64(encoded_image(seed)), "labels": labels}).json()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(classify, range(40, 44)))
    assert all("results" in answer for answer in answers), answers
    assert router.num_texts_encoded - before == len(labels)


LIMIT_CASES = [
    ("/v1/classify", {"image": "IMG", "labels": [f"l{i}" for i in range(9)]}, 422, "too_many_labels", "labels"),
    ("/v1/classify", {"image": "IMG", "labels": []}, 422, "empty_labels", "labels"),
    ("/v1/classify", {"image": "IMG", "labels": ["cat", "  "]}, 422, "empty_label", "labels[1]"),
    ("/v1/classify", {"image": "IMG", "labels": ["cat"], "template": "no placeholder"}, 422, "invalid_template",
     "template"),
    ("/v1/classify", {"image": "IMG", "labels": ["cat"], "template": "{} and {}"}, 422, "invalid_template",
     "template"),
    ("/v1/classify", {"labels": ["cat"]}, 422, "missing_image", "image"),
    ("/v1/classify", {"image": "IMG", "labels": ["cat " * 100]}, 422, "text_too_long", "labels[0]"),
    ("/v1/classify", {"images": ["IMG", {"b64": "bm90IGFuIGltYWdl"}], "labels": ["cat"]}, 415,
     "unsupported_image_format", "images[1]"),
    ("/v1/rank", {"query": "a cat", "candidates": ["IMG"] * 5}, 422, "too_many_candidates", "candidates"),
    ("/v1/rank", {"query": "a cat", "candidates": []}, 422, "empty_candidates", "candidates"),
    ("/v1/rank", {"query": "a cat", "candidates": ["IMG", "a dog"]}, 422, "mixed_candidates", "candidates[1]"),
    ("/v1/rank", {"query": "a cat", "candidates": ["a dog"]}, 422, "same_modality", "candidates"),
    ("/v1/rank", {"query": "IMG", "candidates": ["a dog", " "]}, 422, "empty_text", "candidates[1]"),
    ("/v1/rank", {"query": "", "candidates": ["IMG"]}, 422, "empty_text", "query"),
    ("/v1/classify", {"image": "IMG", "labels": ["cat"], "top_k": 0}, 422, "invalid_request", "top_k"),
]


@pytest.mark.parametrize(("path", "body", "status", "code", "field"), LIMIT_CASES,
                         ids=[case[3] + "-" + case[4] for case in LIMIT_CASES])
def test_limits_and_bad_input_get_their_named_error(path, body, status, code, field, servers):
    image = _b64(encoded_image(5))

    def filled(value):
        if value == "IMG":
            return image
        if isinstance(value, list):
            return [filled(v) for v in value]
        return value

    body = {key: filled(value) for key, value in body.items()}
    with servers["clip"].client() as client:
        before = _requests_total(client, path.rsplit("/", 1)[1], str(status))
        answer = client.post(path, json=body)
        assert answer.status_code == status, answer.text
        error = answer.json()["error"]
        assert (error["code"], error.get("field")) == (code, field)
        if code.startswith("too_many"):
            assert ("8" if code == "too_many_labels" else "4") in error["message"]
            assert "MMSERVE_MAX_" in error["message"]
        assert _requests_total(client, path.rsplit("/", 1)[1], str(status)) == before + 1
        assert client.post("/v1/classify", json={"image": image, "labels": ["still", "serving"]}).status_code == 200


def test_a_model_without_a_calibrated_score_or_trained_head_is_refused(tiny_server):
    with tiny_server.client() as client:
        for path, body in (("/v1/classify", {"image": _b64(encoded_image(1)), "labels": ["cat"]}),
                           ("/v1/rank", {"query": "a cat", "candidates": [_b64(encoded_image(1))]})):
            answer = client.post(path, json=body)
            assert answer.status_code == 422, answer.text
            assert answer.json()["error"]["code"] == "no_calibrated_score"


def test_a_trained_fusion_head_answers_with_the_match_score_infer_gives(tmp_path: Path):
    """A tiny mmserve repository with a trained head beside it: classify's and rank's scores are
    ``/v1/infer``'s ``match_score`` of each image with each templated label."""
    from tests.conftest import run_live_server

    repository = write_tiny_with_a_trained_head(tmp_path / "tiny")
    image, labels = _b64(encoded_image(9)), ["cat", "a dog", "bicycle"]
    with run_live_server(Settings(model=str(repository), device="cpu")) as server, server.client() as client:
        classified = client.post("/v1/classify", json={"image": image, "labels": labels, "template": "a {}"})
        ranked = client.post("/v1/rank", json={"query": image, "candidates": labels})
        want = [client.post("/v1/infer", json={"image": image, "text": f"a {label}"}).json()["match_score"]
                for label in labels]
        plain = [client.post("/v1/infer", json={"image": image, "text": label}).json()["match_score"]
                 for label in labels]
    assert classified.status_code == 200, classified.text
    assert classified.json()["score_kind"] == ranked.json()["score_kind"] == "match_score"
    got = {entry["label"]: entry["score"] for entry in classified.json()["results"][0]["labels"]}
    assert [got[label] for label in labels] == pytest.approx(want, abs=TOLERANCE)
    assert [r["index"] for r in ranked.json()["results"]] == list(np.argsort(-np.array(plain), kind="stable"))
    assert [r["score"] for r in ranked.json()["results"]] == pytest.approx(sorted(plain, reverse=True), abs=TOLERANCE)


def test_a_classify_refused_for_an_image_computes_no_label(servers):
    """The labels wait for the images to be prepared: a call refused for its second image encodes none of
    them, so the next call with those labels misses, as with API processes, which decode first."""
    server = servers["clip"]
    router = server.app.state.mmserve.router
    labels = ["a label refused with its image", "another label refused with its image"]
    with server.client() as client:
        before = router.num_texts_encoded
        refused = client.post("/v1/classify", json={"images": [_b64(encoded_image(71)), {"b64": "bm90IGFuIGltYWdl"}],
                                                    "labels": labels})
        assert refused.status_code == 415 and refused.json()["error"]["field"] == "images[1]"
        _wait_for_no_claims(server)
        assert router.num_texts_encoded == before
        answered = client.post("/v1/classify", json={"image": _b64(encoded_image(71)), "labels": labels})
    assert answered.status_code == 200, answered.text
    assert answered.json()["cache"]["texts"]["miss"] == 2 and router.num_texts_encoded == before + 2


def _wait_for_no_claims(server) -> None:
    import time

    cache = server.app.state.mmserve.router.cache
    deadline = time.monotonic() + 5.0
    while cache.num_in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
    assert cache.num_in_flight == 0, f"{cache.num_in_flight} claim(s) left unresolved"


@pytest.mark.parametrize("exit_path", ["bad_image", "deadline", "client_left"])
def test_every_exit_settles_the_label_claims_and_the_labels_still_serve(exit_path, servers):
    server = servers["clip"]
    labels = [f"{exit_path} label {index}" for index in range(8)]
    body = {"image": _b64(encoded_image(61)), "labels": labels}
    if exit_path == "bad_image":
        answer = server.client().post("/v1/classify", json={**body, "image": {"b64": "bm90IGFuIGltYWdl"}})
        assert answer.status_code == 415 and answer.json()["error"]["field"] == "image"
    elif exit_path == "deadline":
        answer = server.client().post("/v1/classify", json={**body, "timeout_ms": 1})
        assert answer.status_code in (503, 504), answer.text
        assert answer.json()["error"]["code"] in ("overloaded", "deadline_exceeded")
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/classify", json=body,
                       timeout=0.001)
    _wait_for_no_claims(server)
    with server.client() as client:
        answer = client.post("/v1/classify", json=body)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["results"][0]["labels"]) == len(labels)


def test_a_siglip_label_over_64_tokens_is_cut_as_the_pipeline_cuts_it(model_dirs, servers):
    directory = model_dirs["siglip"]
    labels = ["a red bicycle leaning on a wall " * 12, "snow on the mountains"]
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    assert len(tokenizer(f"This is a photo of {labels[0]}.")["input_ids"]) > 64
    image = encoded_image(71, UNRESIZED_PX["siglip"])
    want = pipeline("zero-shot-image-classification", model=str(directory), device="cpu")(
        _rgb(image), candidate_labels=labels)
    with servers["siglip"].client() as client:
        answer = client.post("/v1/classify", json={"image": _b64(image), "labels": labels})
    assert answer.status_code == 200, answer.text
    got = answer.json()["results"][0]["labels"]
    assert [entry["label"] for entry in got] == [entry["label"] for entry in want]
    np.testing.assert_allclose([e["score"] for e in got], [e["score"] for e in want], rtol=0, atol=TOLERANCE)


def test_classify_and_rank_need_a_key_when_keys_are_set(live_server_factory):
    body = {"image": _b64(encoded_image(1)), "labels": ["cat"]}
    with live_server_factory(api_keys="secret-key") as server, server.client() as client:
        for path, json in (("/v1/classify", body), ("/v1/rank", {"query": "cat", "candidates": [body["image"]]})):
            assert client.post(path, json=json).status_code == 401
            keyed = client.post(path, json=json, headers={"Authorization": "Bearer secret-key"})
            assert keyed.json()["error"]["code"] == "no_calibrated_score"  # past the key check: the tiny model's answer


def test_classify_is_traced_and_its_latency_monitored_under_its_own_route(model_dirs):
    import time

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    from tests.conftest import run_live_server

    trace_id, span_id = 0x4BF92F3577B34DA6A3CE929D0E0E4737, 0x00F067AA0BA902B8
    exporter = InMemorySpanExporter()
    settings = Settings(model=str(model_dirs["clip"]), device="cpu", trace_sample_ratio=1.0, trace_slow_ms=0)
    with run_live_server(settings, span_exporter=exporter) as server, server.client() as client:
        answer = client.post("/v1/classify", json={"images": [_b64(encoded_image(81)), _b64(encoded_image(82))],
                                                   "labels": ["traced cat", "traced dog"]},
                             headers={"traceparent": f"00-{trace_id:032x}-{span_id:016x}-01"})
        ranked = client.post("/v1/rank", json={"query": _b64(encoded_image(81)), "candidates": ["a", "b"]})
        assert answer.status_code == ranked.status_code == 200
        assert answer.headers["traceparent"].split("-")[1] == f"{trace_id:032x}"
        deadline, exported = time.monotonic() + 10, ""
        while time.monotonic() < deadline:
            exported = client.get("/metrics").text
            if all(f'mmserve_stage_latency_seconds{{quantile="0.5",route="{route}",stage="total"}}' in exported
                   for route in ("classify", "rank")):
                break
            time.sleep(0.2)
    assert 'mmserve_stage_latency_seconds{quantile="0.5",route="classify",stage="total"}' in exported
    assert 'mmserve_stage_latency_seconds{quantile="0.5",route="rank",stage="total"}' in exported
    assert 'mmserve_requests_total{code="200",route="classify"}' in exported
    # The run's own stages reach the monitor through the request layer, as the answer shows them.
    timings = answer.json()["timings_ms"]
    assert {"decode", "text", "score", "total"} <= set(timings) and timings["score"] <= timings["total"]
    for stage in ("decode", "text", "score"):
        assert f'mmserve_stage_latency_seconds{{quantile="0.5",route="classify",stage="{stage}"}}' in exported
    assert answer.headers["X-Request-ID"] == answer.json()["id"]
    spans = [span for span in exporter.get_finished_spans() if span.context.trace_id == trace_id]
    root = next(span for span in spans if span.kind == SpanKind.SERVER)
    assert root.name == "POST /v1/classify" and root.parent.span_id == span_id
    assert dict(root.attributes)["mmserve.route"] == "classify" and dict(root.attributes)["mmserve.rows"] == 2
    assert root.links  # to the batches that computed its images
