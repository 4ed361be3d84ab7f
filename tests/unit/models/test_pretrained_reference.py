"""SigLIP and CLIP served by mmserve give what transformers gives on the same inputs.

Each model is small and random, built with transformers' own constructors and
written with ``save_pretrained`` (``benchmarks.random_pretrained``); the
reference is computed here with the library's classes read from the same
directory: its PIL image processor, its tokenizer, ``get_image_features``,
``get_text_features`` and the model's ``logits_per_image``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from huggingface_hub import constants
from PIL import Image
from transformers import AutoModel, AutoTokenizer, CLIPImageProcessorPil, SiglipImageProcessorPil

from benchmarks.random_pretrained import write_clip, write_hub_cache, write_siglip
from kernels import preprocess_uint8
from models.errors import ModelRepositoryError, TextTooLongError
from models.preprocessing import resize_to_model_input
from models.families.pretrained import load_pretrained
from tests.onnx_runtimes import RUNTIMES, on_runtime

TOLERANCE = 1e-5
FAMILIES = {
    "siglip": (write_siglip, SiglipImageProcessorPil, {"padding": "max_length"}),
    "clip": (write_clip, CLIPImageProcessorPil, {"padding": True}),
}
TEXTS = ["a photo of a cat", "two dogs", "一只猫坐在窗台上，看着外面的雨"]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory) -> tuple[str, Path]:
    directory = tmp_path_factory.mktemp(request.param) / "model"
    FAMILIES[request.param][0](directory)
    return request.param, directory


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(7)
    sizes = [(32, 32), (60, 45), (17, 90), (200, 120)]  # (W, H): square, landscape, a strip, larger than input
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def _reference(family: tuple[str, Path]):
    name, directory = family
    model = AutoModel.from_pretrained(str(directory)).eval()
    processor = FAMILIES[name][1].from_pretrained(str(directory))
    return model, AutoTokenizer.from_pretrained(str(directory)), processor


def test_pixel_values_equal_the_image_processor(family):
    bundle = load_pretrained(str(family[1]))
    _, _, processor = _reference(family)
    preprocess = bundle.config.preprocess
    for image in _images():
        expected = processor(images=image, return_tensors="pt")["pixel_values"]  # (1, 3, S, S)
        uint8 = torch.from_numpy(resize_to_model_input(image, preprocess))[None]  # (1, S, S, 3)
        ours = preprocess_uint8(uint8, preprocess.mean, preprocess.std, torch.float32)
        assert ours.shape == expected.shape
        torch.testing.assert_close(ours, expected, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_embeddings_and_score_equal_transformers(family, runtime):
    name, directory = family
    bundle = on_runtime(load_pretrained(str(directory)), runtime)
    model, tokenizer, processor = _reference(family)
    images = _images()
    pixel_values = processor(images=images, return_tensors="pt")["pixel_values"]
    text_inputs = tokenizer(TEXTS[: len(images) - 1] + TEXTS[:1], return_tensors="pt", **FAMILIES[name][2],
                            truncation=True)
    with torch.no_grad():
        want_images = F.normalize(model.get_image_features(pixel_values=pixel_values).pooler_output, dim=-1)
        want_texts = F.normalize(model.get_text_features(**text_inputs).pooler_output, dim=-1)
        logits = model(pixel_values=pixel_values, **text_inputs).logits_per_image.diagonal()
    want_scores = torch.sigmoid(logits) if name == "siglip" else logits

    uint8 = torch.from_numpy(np.stack([resize_to_model_input(i, bundle.config.preprocess) for i in images]))
    image_segments = bundle.model.encode_images(uint8)
    token_ids = [bundle.tokenizer.encode(t, truncate=True).token_ids for t in TEXTS[: len(images) - 1] + TEXTS[:1]]
    text_segments = bundle.model.encode_texts(token_ids, pad_to=bundle.model.text.fixed_length,
                                              pad_token_id=bundle.tokenizer.pad_token_id)
    fused = bundle.model.fuse(image_segments, text_segments)
    torch.testing.assert_close(torch.stack([s.pooled for s in image_segments]), want_images, rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(torch.stack([s.pooled for s in text_segments]), want_texts, rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(torch.stack([f.score for f in fused]), want_scores, rtol=0, atol=TOLERANCE)


def test_token_ids_are_the_tokenizers_own(family):
    name, directory = family
    bundle = load_pretrained(str(directory))
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    for text in TEXTS:
        assert list(bundle.tokenizer.encode(text, truncate=True).token_ids) == tokenizer(
            text, truncation=True, max_length=bundle.tokenizer.max_tokens)["input_ids"]


def test_the_description_names_family_score_and_an_untrained_head(family):
    name, directory = family
    described = load_pretrained(str(directory)).describe()
    assert described.family == name
    assert described.score == {"siglip": "siglip_sigmoid", "clip": "clip_logit"}[name]
    assert described.normalized_embeddings is True and described.fusion_head == "untrained"
    raw = load_pretrained(str(directory), normalize_embeddings=False)
    assert raw.describe().normalized_embeddings is False and raw.fingerprint != load_pretrained(
        str(directory)).fingerprint


def test_the_fingerprint_is_stable_and_follows_the_weights(tmp_path: Path):
    first = load_pretrained(str(write_siglip(tmp_path / "a", seed=0))).fingerprint
    assert load_pretrained(str(write_siglip(tmp_path / "b", seed=0))).fingerprint == first
    assert load_pretrained(str(write_siglip(tmp_path / "c", seed=1))).fingerprint != first


def test_a_hub_id_is_found_in_the_local_cache_offline(tmp_path: Path, monkeypatch):
    cache = tmp_path / "hub"
    write_hub_cache(cache, "acme/tiny-siglip", write_siglip(tmp_path / "model"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    bundle = load_pretrained("acme/tiny-siglip")
    assert bundle.config.name == "acme/tiny-siglip" and bundle.config.family == "siglip"
    assert bundle.fingerprint == load_pretrained(str(tmp_path / "model")).fingerprint


def test_a_missing_hub_id_offline_names_the_id_and_the_cache(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelRepositoryError) as refused:
        load_pretrained("acme/not-here")
    assert "acme/not-here" in str(refused.value) and str(tmp_path / "empty") in str(refused.value)


def test_pickled_weights_are_refused_with_how_to_convert(tmp_path: Path):
    directory = write_clip(tmp_path / "clip")
    (directory / "model.safetensors").rename(directory / "pytorch_model.bin")
    with pytest.raises(ModelRepositoryError) as refused:
        load_pretrained(str(directory))
    assert "pytorch_model.bin" in str(refused.value) and "safetensors" in str(refused.value)
    assert "save_pretrained" in str(refused.value)


def test_an_unsupported_model_type_is_named(tmp_path: Path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ModelRepositoryError, match="'llama' is not served"):
        load_pretrained(str(tmp_path))


def test_siglip2_is_refused_with_the_reason(tmp_path: Path):
    (tmp_path / "config.json").write_text('{"model_type": "siglip2"}')
    with pytest.raises(ModelRepositoryError, match="not served yet: SigLIP 2 NaFlex"):
        load_pretrained(str(tmp_path))


def test_an_over_long_text_is_cut_like_the_siglip_pipeline_and_refused_by_clip(family):
    name, directory = family
    bundle = load_pretrained(str(directory))
    text = "猫" * 200
    if name == "clip":
        with pytest.raises(TextTooLongError):
            bundle.tokenizer.encode(text, truncate=False)
        return
    tokenized = bundle.tokenizer.encode(text, truncate=False)  # the transformers pipeline's truncation=True
    want = AutoTokenizer.from_pretrained(str(directory))(text, truncation=True, max_length=bundle.tokenizer.max_tokens)
    assert tokenized.is_truncated and list(tokenized.token_ids) == want["input_ids"]
