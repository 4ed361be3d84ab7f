"""OpenCLIP served by mmserve gives what open_clip gives on the same inputs.

The models are small and random, built by open_clip from a model config and
written in the layout of its ``save_for_hf`` (``benchmarks.random_pretrained.write_open_clip``);
the reference is open_clip's own ``create_model_and_transforms("local-dir:...")``
on the same directory: its inference transform, its tokenizer,
``encode_image``, ``encode_text`` and ``get_logits``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
from huggingface_hub import constants
from PIL import Image

from benchmarks.random_pretrained import write_hub_cache, write_open_clip
from kernels import preprocess_uint8
from models.errors import ModelRepositoryError
from models.preprocessing import resize_to_model_input
from models.families.pretrained import load_pretrained
from tests.onnx_runtimes import RUNTIMES, on_runtime

TOLERANCE = 1e-5
TEXTS = ["a photo of a cat", "two dogs!! playing on the grass", "一只猫坐在窗台上，看着外面的雨", "猫" * 200]


@pytest.fixture(scope="module", params=["clip", "sigmoid"])
def checkpoint(request, tmp_path_factory) -> tuple[str, Path]:
    directory = write_open_clip(tmp_path_factory.mktemp(request.param) / "model", sigmoid=request.param == "sigmoid")
    return request.param, directory


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(11)
    sizes = [(32, 32), (61, 45), (17, 90), (200, 121)]  # (W, H): square, landscape, a strip, larger than input
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def _reference(directory: Path):
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{directory}")
    return model.eval(), transform, open_clip.get_tokenizer(f"local-dir:{directory}")


def test_pixel_values_equal_open_clips_transform(checkpoint):
    bundle = load_pretrained(str(checkpoint[1]))
    _, transform, _ = _reference(checkpoint[1])
    preprocess = bundle.config.preprocess
    for image in _images():
        expected = transform(image)[None]  # (1, 3, S, S)
        uint8 = torch.from_numpy(resize_to_model_input(image, preprocess))[None]  # (1, S, S, 3)
        ours = preprocess_uint8(uint8, preprocess.mean, preprocess.std, torch.float32)
        assert ours.shape == expected.shape
        torch.testing.assert_close(ours, expected, rtol=0, atol=TOLERANCE)


def test_token_ids_are_open_clips_own(checkpoint):
    bundle = load_pretrained(str(checkpoint[1]))
    _, _, tokenizer = _reference(checkpoint[1])
    rows = tokenizer(TEXTS)  # (B, 77), zero-padded
    for text, row in zip(TEXTS, rows):
        ours = bundle.tokenizer.encode(text, truncate=False)  # open_clip always truncates: so does the family
        padded = list(ours.token_ids) + [bundle.tokenizer.pad_token_id] * (len(row) - len(ours.token_ids))
        assert padded == row.tolist()
    assert bundle.tokenizer.encode(TEXTS[-1], truncate=False).is_truncated


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_embeddings_and_score_equal_open_clip(checkpoint, runtime):
    name, directory = checkpoint
    bundle = on_runtime(load_pretrained(str(directory)), runtime)
    model, transform, tokenizer = _reference(directory)
    images = _images()
    with torch.no_grad():
        pixel_values = torch.stack([transform(i) for i in images])
        text_ids = tokenizer(TEXTS)
        want_images = model.encode_image(pixel_values, normalize=True)
        want_texts = model.encode_text(text_ids, normalize=True)
        logits = model.get_logits(pixel_values, text_ids)[0].diagonal()
    want_scores = torch.sigmoid(logits) if name == "sigmoid" else logits

    uint8 = torch.from_numpy(np.stack([resize_to_model_input(i, bundle.config.preprocess) for i in images]))
    image_segments = bundle.model.encode_images(uint8)
    token_ids = [bundle.tokenizer.encode(t, truncate=False).token_ids for t in TEXTS]
    text_segments = bundle.model.encode_texts(token_ids, pad_to=bundle.model.text.fixed_length,
                                              pad_token_id=bundle.tokenizer.pad_token_id)
    fused = bundle.model.fuse(image_segments, text_segments)
    torch.testing.assert_close(torch.stack([s.pooled for s in image_segments]), want_images, rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(torch.stack([s.pooled for s in text_segments]), want_texts, rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(torch.stack([f.score for f in fused]), want_scores, rtol=0, atol=TOLERANCE)
    assert text_segments[0].q.shape[0] == len(token_ids[0])  # the head sees the real tokens only


def test_the_description_names_family_and_score(checkpoint):
    name, directory = checkpoint
    described = load_pretrained(str(directory)).describe()
    assert (described.family, described.score) == ("open_clip", {"clip": "clip_logit",
                                                                 "sigmoid": "siglip_sigmoid"}[name])
    assert described.normalized_embeddings is True and described.fusion_head == "untrained"


def test_the_fingerprint_follows_the_weights_not_the_place(tmp_path: Path):
    first = load_pretrained(str(write_open_clip(tmp_path / "a", seed=0))).fingerprint
    assert load_pretrained(str(write_open_clip(tmp_path / "b", seed=0))).fingerprint == first
    assert load_pretrained(str(write_open_clip(tmp_path / "c", seed=1))).fingerprint != first


def test_a_hub_id_is_found_in_the_local_cache_offline(tmp_path: Path, monkeypatch):
    cache = tmp_path / "hub"
    write_hub_cache(cache, "acme/tiny-open-clip", write_open_clip(tmp_path / "model"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    bundle = load_pretrained("acme/tiny-open-clip")
    assert bundle.config.name == "acme/tiny-open-clip" and bundle.config.family == "open_clip"
    assert bundle.fingerprint == load_pretrained(str(tmp_path / "model")).fingerprint


def test_pickled_weights_are_refused(tmp_path: Path):
    directory = write_open_clip(tmp_path / "model")
    (directory / "open_clip_model.safetensors").rename(directory / "open_clip_pytorch_model.bin")
    with pytest.raises(ModelRepositoryError, match="safetensors only"):
        load_pretrained(str(directory))


def test_a_missing_open_clip_names_the_extra(tmp_path: Path, monkeypatch):
    directory = write_open_clip(tmp_path / "model")
    monkeypatch.setitem(__import__("sys").modules, "open_clip", None)  # `import open_clip` raises ImportError
    with pytest.raises(ModelRepositoryError, match=r"pip install 'mmserve\[openclip\]'"):
        load_pretrained(str(directory))
