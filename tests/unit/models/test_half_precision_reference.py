"""bfloat16 serving against each family's float32 reference library, on the same inputs.

Every family mmserve serves (transformers SigLIP and CLIP, open_clip with a
CLIP logit and with a sigmoid, a timm ViT beside a transformers text encoder)
is loaded at ``dtype="bfloat16"`` and compared with what its own library
computes in float32 from the same directory: cosine >= 0.999 for every image
and text embedding, and the calibrated score within the bound README's family
table states for bfloat16, ``|score - reference| <= 0.01 * exp(logit_scale)``
for a CLIP logit and a quarter of that for a SigLIP probability (the
sigmoid's slope is at most 1/4). The models are tiny and random, built with
the libraries' own constructors (``benchmarks.random_pretrained``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import open_clip
import pytest
import timm
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data import create_transform, resolve_data_config
from transformers import AutoModel, AutoTokenizer, CLIPImageProcessorPil, SiglipImageProcessorPil

from benchmarks.random_pretrained import write_clip, write_open_clip, write_siglip, write_timm_bert_repository
from models.families.pretrained import load_pretrained
from models.loading.repository import ModelBundle
from models.preprocessing import resize_to_model_input

MIN_COSINE = 0.999
BF16_COSINE_ERROR = 0.01  # README: the score's bound is this times the model's score scale
TEXTS = ["a photo of a cat", "two dogs playing on the grass", "一只猫坐在窗台上", "a red bicycle"]


@dataclass(frozen=True)
class Reference:
    """The library's float32 image and text embeddings (B, E), and its score per (image i, text i) pair."""

    images: torch.Tensor
    texts: torch.Tensor
    scores: torch.Tensor | None
    score_scale: float  # exp(logit_scale); 0 without a score
    is_sigmoid: bool = False


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(3)
    sizes = [(32, 32), (61, 45), (17, 90), (200, 121)]  # (W, H)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]


def _transformers_reference(directory: Path, name: str) -> Reference:
    model = AutoModel.from_pretrained(str(directory)).eval()
    processor = {"siglip": SiglipImageProcessorPil, "clip": CLIPImageProcessorPil}[name].from_pretrained(str(directory))
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    padding = "max_length" if name == "siglip" else True
    pixel_values = processor(images=_images(), return_tensors="pt")["pixel_values"]
    text_inputs = tokenizer(TEXTS, return_tensors="pt", padding=padding, truncation=True)
    with torch.no_grad():
        images = F.normalize(model.get_image_features(pixel_values=pixel_values).pooler_output, dim=-1)
        texts = F.normalize(model.get_text_features(**text_inputs).pooler_output, dim=-1)
        logits = model(pixel_values=pixel_values, **text_inputs).logits_per_image.diagonal()
    is_sigmoid = name == "siglip"
    return Reference(images, texts, torch.sigmoid(logits) if is_sigmoid else logits,
                     float(model.logit_scale.detach().exp()), is_sigmoid)


def _open_clip_reference(directory: Path, is_sigmoid: bool) -> Reference:
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{directory}")
    model.eval()
    tokenizer = open_clip.get_tokenizer(f"local-dir:{directory}")
    with torch.no_grad():
        pixel_values = torch.stack([transform(i) for i in _images()])
        ids = tokenizer(TEXTS)
        images = model.encode_image(pixel_values, normalize=True)
        texts = model.encode_text(ids, normalize=True)
        logits = model.get_logits(pixel_values, ids)[0].diagonal()
    return Reference(images, texts, torch.sigmoid(logits) if is_sigmoid else logits,
                     float(model.logit_scale.detach().exp()), is_sigmoid)


def _timm_bert_reference(directory: Path) -> Reference:
    vit = timm.create_model(f"local-dir:{directory / 'vit'}", pretrained=True).eval()
    transform = create_transform(**resolve_data_config({}, model=vit))
    bert = AutoModel.from_pretrained(str(directory / "bert")).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(directory / "bert"))
    inputs = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        images = vit.forward_head(vit.forward_features(torch.stack([transform(i) for i in _images()])),
                                  pre_logits=True)
        hidden = bert(**inputs).last_hidden_state  # (B, L, d)
    mask = inputs["attention_mask"].unsqueeze(-1).float()  # (B, L, 1)
    return Reference(images, (hidden * mask).sum(1) / mask.sum(1), None, 0.0)


@dataclass(frozen=True)
class Family:
    write: Callable[[Path], Path]
    reference: Callable[[Path], Reference]


FAMILIES = {
    "siglip": Family(write_siglip, lambda d: _transformers_reference(d, "siglip")),
    "clip": Family(write_clip, lambda d: _transformers_reference(d, "clip")),
    "open_clip": Family(write_open_clip, lambda d: _open_clip_reference(d, False)),
    "open_clip_sigmoid": Family(lambda d: write_open_clip(d, sigmoid=True), lambda d: _open_clip_reference(d, True)),
    "timm_bert_repository": Family(write_timm_bert_repository, _timm_bert_reference),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, FAMILIES[request.param].write(tmp_path_factory.mktemp(request.param) / "model")


def _served(bundle: ModelBundle) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The bundle's image and text embeddings and its scores for (image i, text i), as the server computes them."""
    uint8 = torch.from_numpy(np.stack([resize_to_model_input(i, bundle.config.preprocess) for i in _images()]))
    images = bundle.model.encode_images(uint8)
    ids = [bundle.tokenizer.encode(t, truncate=True).token_ids for t in TEXTS]
    texts = bundle.model.encode_texts(ids, pad_to=bundle.model.text.fixed_length,
                                      pad_token_id=bundle.tokenizer.pad_token_id)
    fused = bundle.model.fuse(images, texts)
    scores = None if bundle.model.score is None else torch.stack([f.score for f in fused])
    return (torch.stack([s.pooled for s in images]), torch.stack([s.pooled for s in texts]), scores)


def test_bfloat16_embeddings_are_within_cosine_0999_of_the_float32_library(family):
    name, directory = family
    reference = FAMILIES[name].reference(directory)
    bundle = load_pretrained(str(directory), dtype="bfloat16")
    assert next(bundle.model.vision.parameters()).dtype == torch.bfloat16  # it really computes in bf16
    images, texts, _ = _served(bundle)
    assert images.dtype == texts.dtype == torch.float32  # served as float32 numbers
    image_cosines = F.cosine_similarity(images, reference.images, dim=-1)
    text_cosines = F.cosine_similarity(texts, reference.texts, dim=-1)
    assert image_cosines.min() >= MIN_COSINE, image_cosines
    assert text_cosines.min() >= MIN_COSINE, text_cosines
    # bf16 is not float32: the comparison above is not vacuous.
    assert not torch.equal(images, reference.images.float())


def test_bfloat16_scores_are_within_the_stated_bound(family):
    name, directory = family
    reference = FAMILIES[name].reference(directory)
    _, _, scores = _served(load_pretrained(str(directory), dtype="bfloat16"))
    if reference.scores is None:
        assert scores is None  # a timm ViT beside a text encoder has no calibrated score
        return
    bound = BF16_COSINE_ERROR * reference.score_scale * (0.25 if reference.is_sigmoid else 1.0)
    assert scores.dtype == torch.float32
    assert (scores - reference.scores).abs().max() <= bound


def test_the_dtype_is_described_and_changes_the_fingerprint(family):
    _, directory = family
    float32 = load_pretrained(str(directory))
    bfloat16 = load_pretrained(str(directory), dtype="bfloat16")
    assert (float32.describe().dtype, bfloat16.describe().dtype) == ("float32", "bfloat16")
    assert float32.fingerprint != bfloat16.fingerprint
    assert load_pretrained(str(directory), dtype="float32").fingerprint == float32.fingerprint
