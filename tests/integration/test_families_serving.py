"""Live servers for OpenCLIP, a timm ViT + BERT repository, and 200 CJK characters, checked against the libraries.

OpenCLIP runs as ``mmserve serve --model acme/tiny-open-clip`` in its own
process, resolved offline from a Hub cache laid out by the test; the others
run in-process. References are computed in the test process with open_clip,
timm and transformers reading the same files.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import open_clip
import pytest
import timm
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data import create_transform, resolve_data_config
from transformers import AutoModel, AutoTokenizer, SiglipImageProcessorPil

from benchmarks.random_pretrained import write_hub_cache, write_open_clip, write_siglip, write_timm_bert_repository
from server.settings import Settings
from tests.encoded_images import encoded_image
from tests.onnx_runtimes import RUNTIMES

pytestmark = pytest.mark.long  # minutes together: started first (tests/conftest.py)

TOLERANCE = 1e-5
CJK_200 = ("一只猫坐在窗台上两只狗在草地上玩耍桌子上有一碗水果夜晚的城市天际线" * 7)[:200]


def _rgb(png: bytes) -> Image.Image:
    return Image.open(io.BytesIO(png)).convert("RGB")


def _b64(png: bytes) -> dict:
    return {"b64": base64.b64encode(png).decode()}


@dataclass(frozen=True)
class OpenClipCase:
    hub: Path
    image: bytes
    text: str
    want_image: torch.Tensor
    want_texts: torch.Tensor
    want_logit: float


@pytest.fixture(scope="module")
def open_clip_case(tmp_path_factory) -> OpenClipCase:
    """The Hub cache and open_clip's own answers, written and computed once for both runtimes' servers."""
    root = tmp_path_factory.mktemp("open-clip")
    snapshot = write_hub_cache(root / "hub", "acme/tiny-open-clip", write_open_clip(root / "model"))
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{snapshot}")
    tokenizer = open_clip.get_tokenizer(f"local-dir:{snapshot}")
    image, text = encoded_image(5, (64, 40)), "a red bicycle leaning on a wall"
    with torch.no_grad():
        pixels = transform(_rgb(image))[None]
        ids = tokenizer([text, CJK_200])
        want_image = model.eval().encode_image(pixels, normalize=True)[0]
        want_texts = model.encode_text(ids, normalize=True)
        want_logit = float(model.get_logits(pixels, ids[:1])[0][0, 0])
    return OpenClipCase(root / "hub", image, text, want_image, want_texts, want_logit)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_open_clip_from_the_hub_cache_answers_as_open_clip(open_clip_case: OpenClipCase, serve_process, runtime):
    case = open_clip_case
    image, text, want_image, want_texts, want_logit = (case.image, case.text, case.want_image, case.want_texts,
                                                       case.want_logit)
    env = {"HF_HUB_CACHE": str(case.hub), "HF_HUB_OFFLINE": "1"}
    with serve_process(["--model", "acme/tiny-open-clip", "--device", "cpu", "--runtime", runtime], env) as served:
        answer = httpx.post(f"{served.url}/v1/infer", timeout=60, json={"text": text, "image": _b64(image)}).json()
        long_text = httpx.post(f"{served.url}/v1/infer", timeout=60, json={"text": CJK_200})
    assert {k: answer["model"][k] for k in ("name", "family", "score", "runtime")} == {
        "name": "acme/tiny-open-clip", "family": "open_clip", "score": "clip_logit", "runtime": runtime}
    np.testing.assert_allclose(answer["image_embedding"], want_image.numpy(), rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(answer["text_embedding"], want_texts[0].numpy(), rtol=0, atol=TOLERANCE)
    assert answer["score"] == pytest.approx(want_logit, abs=1e-4)  # a logit: ~14 times a cosine
    assert long_text.status_code == 200, long_text.text
    assert long_text.json()["text"]["truncated"] is True and long_text.json()["text"]["num_tokens"] == 77
    np.testing.assert_allclose(long_text.json()["text_embedding"], want_texts[1].numpy(), rtol=0, atol=TOLERANCE)


@dataclass(frozen=True)
class TimmBertCase:
    repository: Path
    image: bytes
    want_image: torch.Tensor
    want_text: torch.Tensor


@pytest.fixture(scope="module")
def timm_bert_case(tmp_path_factory) -> TimmBertCase:
    """The timm ViT + BERT repository and timm's and transformers' answers, once for both runtimes' servers."""
    repository = write_timm_bert_repository(tmp_path_factory.mktemp("timm-bert") / "vit-bert")
    vit = timm.create_model(f"local-dir:{repository / 'vit'}", pretrained=True).eval()
    transform = create_transform(**resolve_data_config({}, model=vit))
    bert = AutoModel.from_pretrained(str(repository / "bert")).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(repository / "bert"))
    image = encoded_image(6, (50, 70))
    with torch.no_grad():
        want_image = vit.forward_head(vit.forward_features(transform(_rgb(image))[None]), pre_logits=True)[0]
        inputs = tokenizer([CJK_200], return_tensors="pt")
        want_text = bert(**inputs).last_hidden_state[0].mean(0)  # one unpadded text: the mean over its tokens
    return TimmBertCase(repository, image, want_image, want_text)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_timm_vit_with_bert_answers_as_timm_and_transformers(timm_bert_case: TimmBertCase, live_server_runner,
                                                             runtime):
    repository, image = timm_bert_case.repository, timm_bert_case.image
    want_image, want_text = timm_bert_case.want_image, timm_bert_case.want_text
    with live_server_runner(Settings(model=str(repository), device="cpu", runtime=runtime)) as server, \
            server.client() as client:
        fused = client.post("/v1/infer", json={"text": CJK_200, "image": _b64(image)})
    assert fused.status_code == 200, fused.text
    answer = fused.json()
    assert answer["model"]["family"] == "mmserve" and "score" not in answer
    assert answer["model"]["runtime"] == runtime
    assert answer["text"] == {"num_tokens": 202, "truncated": False, "num_tokens_before_truncation": 202}
    np.testing.assert_allclose(answer["image_embedding"], want_image.numpy(), rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(answer["text_embedding"], want_text.numpy(), rtol=0, atol=TOLERANCE)


@dataclass(frozen=True)
class SiglipCase:
    directory: Path
    image: bytes
    model_max_length: int
    want_text: torch.Tensor
    want_score: float


@pytest.fixture(scope="module")
def siglip_case(tmp_path_factory) -> SiglipCase:
    """The tiny SigLIP and transformers' answers (as its zero-shot pipeline cuts texts), once for both runtimes."""
    directory = write_siglip(tmp_path_factory.mktemp("siglip") / "tiny-siglip")
    model = AutoModel.from_pretrained(str(directory)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    image = encoded_image(7, (40, 40))
    pixels = SiglipImageProcessorPil.from_pretrained(str(directory))(images=_rgb(image), return_tensors="pt")
    # transformers' zero-shot pipeline tokenizes SigLIP texts with padding="max_length", truncation=True
    inputs = tokenizer([CJK_200], padding="max_length", truncation=True, max_length=tokenizer.model_max_length,
                       return_tensors="pt")
    with torch.no_grad():
        want_text = F.normalize(model.get_text_features(**inputs).pooler_output, dim=-1)[0]
        want_score = float(torch.sigmoid(model(**pixels, **inputs).logits_per_image[0, 0]))
    return SiglipCase(directory, image, tokenizer.model_max_length, want_text, want_score)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_siglip_takes_200_cjk_characters_cut_as_its_pipeline_cuts_them(siglip_case: SiglipCase, live_server_runner,
                                                                       runtime):
    directory, image, want_text, want_score = (siglip_case.directory, siglip_case.image, siglip_case.want_text,
                                               siglip_case.want_score)
    with live_server_runner(Settings(model=str(directory), device="cpu", runtime=runtime)) as server, \
            server.client() as client:
        fused = client.post("/v1/infer", json={"text": CJK_200, "image": _b64(image)})
    assert fused.status_code == 200, fused.text
    answer = fused.json()
    assert answer["model"]["runtime"] == runtime
    assert answer["text"]["truncated"] is True and answer["text"]["num_tokens"] == siglip_case.model_max_length
    np.testing.assert_allclose(answer["text_embedding"], want_text.numpy(), rtol=0, atol=TOLERANCE)
    assert answer["score"] == pytest.approx(float(want_score), abs=TOLERANCE)
