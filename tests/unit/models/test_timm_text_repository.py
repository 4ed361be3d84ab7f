"""A model repository pairing a timm ViT (``vision.timm_dir``) with a transformers text encoder (``text.hf_dir``).

Each side is compared with its own library on the same directory: timm's
eval transform (``resolve_data_config`` + ``create_transform``) and
``forward_head(forward_features(x), pre_logits=True)`` for images; the
tokenizer and ``AutoModel`` for text, whose embedding mmserve defines as
the mean of the last hidden states over the real tokens (``models.text``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import yaml
from PIL import Image
from timm.data import create_transform, resolve_data_config
from transformers import AutoModel, AutoTokenizer

from benchmarks.random_pretrained import write_timm_bert_repository, write_timm_vit
from kernels import preprocess_uint8
from models.errors import ModelRepositoryError
from models.preprocessing import resize_to_model_input
from models.families.pretrained import load_pretrained
from models.loading.repository import load_repository
from tests.onnx_runtimes import RUNTIMES, on_runtime

TOLERANCE = 1e-5
TEXTS = ["a photo of a cat", "two dogs playing", "一只猫坐在窗台上", "猫" * 200]


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    return write_timm_bert_repository(tmp_path_factory.mktemp("pair") / "vit-bert")


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(5)
    sizes = [(32, 32), (61, 45), (17, 90), (200, 121)]
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def _timm_reference(directory: Path):
    model = timm.create_model(f"local-dir:{directory}", pretrained=True).eval()
    return model, create_transform(**resolve_data_config({}, model=model))


def test_pixel_values_equal_timms_eval_transform(repository):
    bundle = load_repository(repository)
    _, transform = _timm_reference(repository / "vit")
    preprocess = bundle.config.preprocess
    for image in _images():
        expected = transform(image)[None]  # (1, 3, S, S)
        uint8 = torch.from_numpy(np.array(resize_to_model_input(image, preprocess)))[None]  # (1, S, S, 3)
        torch.testing.assert_close(preprocess_uint8(uint8, preprocess.mean, preprocess.std, torch.float32),
                                   expected, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_image_embeddings_are_timms_pre_logits(repository, runtime):
    bundle = on_runtime(load_repository(repository), runtime)
    model, transform = _timm_reference(repository / "vit")
    images = _images()
    with torch.no_grad():
        want = model.forward_head(model.forward_features(torch.stack([transform(i) for i in images])),
                                  pre_logits=True)
    uint8 = torch.from_numpy(np.stack([resize_to_model_input(i, bundle.config.preprocess) for i in images]))
    got = torch.stack([s.pooled for s in bundle.model.encode_images(uint8)])
    torch.testing.assert_close(got, want, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_text_ids_and_embeddings_are_the_encoders_own(repository, runtime):
    bundle = on_runtime(load_repository(repository), runtime)
    tokenizer = AutoTokenizer.from_pretrained(str(repository / "bert"))
    model = AutoModel.from_pretrained(str(repository / "bert")).eval()
    inputs = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**inputs).last_hidden_state  # (B, L, d)
    mask = inputs["attention_mask"].unsqueeze(-1).float()  # (B, L, 1)
    want = (hidden * mask).sum(1) / mask.sum(1)  # masked mean: mmserve's pooling for a BERT-like encoder
    token_ids = [bundle.tokenizer.encode(t, truncate=False).token_ids for t in TEXTS]
    assert [list(ids) for ids in token_ids] == [tokenizer(t)["input_ids"] for t in TEXTS]
    assert len(token_ids[-1]) == 202 and 1 not in token_ids[-1]  # 200 CJK characters, none unknown
    got = torch.stack([s.pooled for s in bundle.model.encode_texts(token_ids, pad_token_id=bundle.tokenizer.pad_token_id)])
    torch.testing.assert_close(got, want, rtol=0, atol=TOLERANCE)


def test_the_repository_serves_through_model_and_describes_itself(repository):
    bundle = load_pretrained(str(repository))
    described = bundle.describe()
    assert (described.family, described.score, described.fusion_head) == ("mmserve", None, "untrained")
    assert bundle.config.vision.architecture == "vit_tiny_patch16_224"
    assert bundle.fingerprint == load_repository(repository).fingerprint  # the head starts from seed 0


def test_a_bare_timm_directory_points_at_the_pairing(repository):
    with pytest.raises(ModelRepositoryError, match="vision.timm_dir and text.hf_dir"):
        load_pretrained(str(repository / "vit"))


def test_a_preprocess_other_than_the_checkpoints_is_refused(repository, tmp_path: Path):
    written = yaml.safe_load((repository / "model.yaml").read_text())
    written["preprocess"] = {"input_size": 32, "resize_size": 32, "mean": [0.5] * 3, "std": [0.5] * 3}
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({**written, "vision": {"timm_dir": str(repository / "vit")},
                                                         "text": {"hf_dir": str(repository / "bert")}}))
    with pytest.raises(ModelRepositoryError, match="eval transform"):
        load_repository(tmp_path)


def test_pickled_timm_weights_are_refused(tmp_path: Path):
    directory = write_timm_vit(tmp_path / "vit")
    (directory / "model.safetensors").rename(directory / "pytorch_model.bin")
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({"name": "x", "vision": {"timm_dir": "vit"},
                                                         "text": {"hf_dir": "bert"}}))
    with pytest.raises(ModelRepositoryError, match="safetensors only"):
        load_repository(tmp_path)
