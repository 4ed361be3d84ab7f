"""A live server for ``--model`` answers what transformers computes, on every protocol.

SigLIP runs as ``mmserve serve --model acme/tiny-siglip`` in its own process,
resolved offline from a Hub cache laid out by the test; CLIP runs in-process
from its directory. The reference is computed in the test process with the
library's own classes read from the same files.
"""

from __future__ import annotations

import base64
import io
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import tritonclient.http as triton_http
from openai import OpenAI
from PIL import Image
from transformers import AutoConfig, AutoModel, AutoTokenizer, CLIPImageProcessorPil, SiglipImageProcessorPil

from benchmarks.random_pretrained import write_clip, write_hub_cache, write_siglip
from server.settings import Settings
from tests.encoded_images import encoded_image
from tests.onnx_runtimes import RUNTIMES

TOLERANCE = 1e-5


def _reference(directory: Path, processor_class, text: str, image_png: bytes, text_kwargs: dict) -> dict:
    model = AutoModel.from_pretrained(str(directory)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    image = Image.open(io.BytesIO(image_png)).convert("RGB")
    pixel_values = processor_class.from_pretrained(str(directory))(images=image, return_tensors="pt")["pixel_values"]
    text_inputs = tokenizer([text], return_tensors="pt", **text_kwargs)
    with torch.no_grad():
        out = model(pixel_values=pixel_values, **text_inputs)
        image_embedding = F.normalize(model.get_image_features(pixel_values=pixel_values).pooler_output, dim=-1)
        text_embedding = F.normalize(model.get_text_features(**text_inputs).pooler_output, dim=-1)
    return {"image_embedding": image_embedding[0].numpy(), "text_embedding": text_embedding[0].numpy(),
            "logit": float(out.logits_per_image[0, 0])}


@pytest.fixture(scope="module")
def siglip_hub(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("siglip")
    snapshot = write_hub_cache(root / "hub", "acme/tiny-siglip", write_siglip(root / "model"))
    return root / "hub", snapshot


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_siglip_from_the_hub_cache_answers_as_transformers_on_every_protocol(siglip_hub, serve_process, runtime):
    cache, snapshot = siglip_hub
    image, text = encoded_image(3, (48, 40)), "a photo of a cat"
    want = _reference(snapshot, SiglipImageProcessorPil, text, image, {"padding": "max_length"})
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    with serve_process(["--model", "acme/tiny-siglip", "--device", "cpu", "--runtime", runtime], env) as served:
        answer = httpx.post(f"{served.url}/v1/infer", timeout=60,
                            json={"text": text, "image": {"b64": base64.b64encode(image).decode()}}).json()
        assert answer["model"]["name"] == "acme/tiny-siglip" and answer["model"]["runtime"] == runtime
        assert {k: answer["model"][k] for k in ("family", "score", "normalized_embeddings", "fusion_head")} == {
            "family": "siglip", "score": "siglip_sigmoid", "normalized_embeddings": True, "fusion_head": "untrained"}
        np.testing.assert_allclose(answer["image_embedding"], want["image_embedding"], rtol=0, atol=TOLERANCE)
        np.testing.assert_allclose(answer["text_embedding"], want["text_embedding"], rtol=0, atol=TOLERANCE)
        assert answer["score"] == pytest.approx(1 / (1 + np.exp(-want["logit"])), abs=TOLERANCE)
        assert "match_score" not in answer

        client = OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
        embedded = client.embeddings.create(model="acme/tiny-siglip", input=[text, _data_uri(image)])
        np.testing.assert_allclose(embedded.data[0].embedding, want["text_embedding"], rtol=0, atol=TOLERANCE)
        np.testing.assert_allclose(embedded.data[1].embedding, want["image_embedding"], rtol=0, atol=TOLERANCE)
        card = httpx.get(f"{served.url}/v1/models", timeout=10).json()["data"][0]
        assert card["id"] == "acme/tiny-siglip" and card["mmserve"]["score"] == "siglip_sigmoid"

        triton = triton_http.InferenceServerClient(served.url.removeprefix("http://"))
        inputs = [triton_http.InferInput("text", [1], "BYTES"), triton_http.InferInput("image", [1], "BYTES")]
        inputs[0].set_data_from_numpy(np.array([text.encode()], dtype=object))
        inputs[1].set_data_from_numpy(np.array([image], dtype=object))
        result = triton.infer("acme/tiny-siglip", inputs)
        np.testing.assert_allclose(result.as_numpy("score"), [answer["score"]], rtol=0, atol=TOLERANCE)
        assert result.as_numpy("match_score") is None  # untrained head: not an output at all
        served.process.kill()
        log = served.process.communicate()[0]
    assert "fusion head of acme/tiny-siglip is untrained" in log


def test_a_hub_id_missing_from_the_cache_offline_stops_with_the_id_and_the_cache(tmp_path: Path):
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--model", "acme/absent", "--port", "0"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode != 0
    assert "acme/absent" in done.stderr and str(tmp_path / "hub") in done.stderr


# CLIP pools at the end-of-text token under a causal mask: texts of one word up to the 77-token limit, so the
# batch pads each to another length bucket. Images: square, landscape, portrait strip, smaller and larger than 224.
CLIP_TEXTS = ["dogs", "two dogs playing on the grass", "一只猫坐在窗台上，看着外面的雨",
              " ".join(["a very long caption about a red bicycle leaning on a wall"] * 7)]
CLIP_IMAGES = [(70, 50), (100, 300), (224, 224), (500, 20)]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_clip_from_a_directory_answers_as_transformers_on_each_route(tmp_path: Path, live_server_runner, runtime):
    directory = write_clip(tmp_path / "tiny-clip")
    image, text = encoded_image(4, (70, 50)), "two dogs playing on the grass"
    want = _reference(directory, CLIPImageProcessorPil, text, image, {})
    image_b64 = base64.b64encode(image).decode()
    images = [encoded_image(10 + i, size) for i, size in enumerate(CLIP_IMAGES)]
    wants = [_reference(directory, CLIPImageProcessorPil, words, png, {"truncation": True})
             for words, png in zip(CLIP_TEXTS, images, strict=True)]
    with live_server_runner(Settings(model=str(directory), device="cpu", runtime=runtime)) as server, \
            server.client() as client:
        fused = client.post("/v1/infer", json={"text": text, "image": {"b64": image_b64}}).json()
        vision = client.post("/v1/infer", json={"image": {"b64": image_b64}}).json()
        words = client.post("/v1/infer", json={"text": text}).json()
        # one request of several items: the lanes batch them (batch buckets above 1, padded text lengths)
        batched = client.post("/v1/embeddings", json={"model": str(directory), "input": [
            *CLIP_TEXTS[:3], *[_data_uri(png) for png in images]]})
        pairs = [client.post("/v1/infer", json={"text": t, "image": {"b64": base64.b64encode(png).decode()},
                                                "truncate": True}).json()
                 for t, png in zip(CLIP_TEXTS, images, strict=True)]
        # OpenAI's dimensions: the embeddings' own size (CLIP's projection), not the towers' hidden width
        both = [CLIP_TEXTS[0], _data_uri(images[0])]
        projected = client.post("/v1/embeddings", json={"input": both, "dimensions": len(want["text_embedding"])})
        hidden = client.post("/v1/embeddings", json={"input": both, "dimensions": AutoConfig.from_pretrained(
            str(directory)).text_config.hidden_size})
    assert len(want["text_embedding"]) != AutoConfig.from_pretrained(str(directory)).text_config.hidden_size
    assert projected.status_code == 200, projected.text
    assert [len(item["embedding"]) for item in projected.json()["data"]] == [len(want["text_embedding"])] * 2
    assert hidden.status_code == 422 and hidden.json()["error"]["code"] == "unsupported_dimensions"
    assert fused["model"]["family"] == "clip" and fused["model"]["score"] == "clip_logit"
    assert fused["model"]["runtime"] == runtime
    assert batched.status_code == 200, batched.text
    rows = [item["embedding"] for item in batched.json()["data"]]
    for row, reference in zip(rows[:3], wants[:3], strict=True):
        np.testing.assert_allclose(row, reference["text_embedding"], rtol=0, atol=TOLERANCE)
    for row, reference in zip(rows[3:], wants, strict=True):
        np.testing.assert_allclose(row, reference["image_embedding"], rtol=0, atol=TOLERANCE)
    for answer, reference in zip(pairs, wants, strict=True):
        np.testing.assert_allclose(answer["text_embedding"], reference["text_embedding"], rtol=0, atol=TOLERANCE)
        np.testing.assert_allclose(answer["image_embedding"], reference["image_embedding"], rtol=0, atol=TOLERANCE)
        # a logit: exp(logit_scale) ~ 14 times a cosine; upscaled images stay within the resize bound
        assert answer["score"] == pytest.approx(reference["logit"], abs=2e-4)
    assert (vision["route"], words["route"]) == ("vision", "text")
    for answer in (fused, vision):
        np.testing.assert_allclose(answer["image_embedding"], want["image_embedding"], rtol=0, atol=TOLERANCE)
    for answer in (fused, words):
        np.testing.assert_allclose(answer["text_embedding"], want["text_embedding"], rtol=0, atol=TOLERANCE)
    assert fused["score"] == pytest.approx(want["logit"], abs=1e-4)  # a logit: exp(logit_scale) ~ 14 times a cosine
    assert fused["text"]["num_tokens"] == len(AutoTokenizer.from_pretrained(str(directory))(text)["input_ids"])
