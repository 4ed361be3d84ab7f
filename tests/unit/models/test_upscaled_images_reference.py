"""Upscaled images against transformers' two CLIP image processors (issue 43: a 100x300 PNG, 1.45e-4 off).

mmserve resizes as transformers' PIL backend (``CLIPImageProcessorPil``)
does, byte for byte, so on an image smaller than the processor's shortest
edge (upscaled) its pixels and its score equal that backend's. transformers'
default backend (``CLIPImageProcessor``, what ``AutoProcessor`` and
``pipeline`` load in transformers 5) resizes with torchvision in float and
rounds once; Pillow resamples in two passes and rounds to uint8 between them.
The two backends differ from each other by up to 2 uint8 levels on under 1 %
of the pixel values, and that difference, not mmserve's geometry, is what
moves a score by ~1e-4 (README's bound). Each image goes in as PNG bytes
through the CPU decode path the server uses.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoModel, AutoTokenizer, CLIPImageProcessor, CLIPImageProcessorPil

from encoded_images import encode

from benchmarks.random_pretrained import TowerSize, write_clip
from kernels import preprocess_uint8
from models.families.pretrained import load_pretrained
from models.jpeg_decode import cpu_decode_to_input

# 224 px input, shortest edge 252: every size below is upscaled (a 1:3 strip as in the issue, both ways).
SIZE = TowerSize(image_size=224, patch_size=32, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128,
                 projection_dim=48)
SIZES = [(100, 300), (300, 100), (64, 64), (150, 120)]  # (W, H)
TEXT = "a photo of a cat"
MAX_LEVELS_BETWEEN_BACKENDS = 2
MAX_SHARE_DIFFERENT = 0.01
# README: the backends move the image-text cosine by up to about 2e-5, so a CLIP logit by 2e-5 * exp(logit_scale).
README_COSINE_GAP = 2.5e-5


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return write_clip(tmp_path_factory.mktemp("clip") / "model", SIZE)


def _png_images() -> list[bytes]:
    rng = np.random.default_rng(43)
    encoded = []
    for width, height in SIZES:
        y, x = np.mgrid[0:height, 0:width]
        smooth = np.stack([x * 255 / width, y * 255 / height, ((x + y) % 64) * 4.0], axis=-1)  # (H, W, 3)
        pixels = np.clip(smooth + rng.normal(0, 12, smooth.shape), 0, 255).astype(np.uint8)
        encoded.append(encode(Image.fromarray(pixels), "PNG"))
    return encoded


def _decoded(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def _levels(pixel_values: torch.Tensor, std: tuple[float, ...]) -> torch.Tensor:
    """Normalised pixel values back to uint8 levels (mean dropped: only differences are compared)."""
    return pixel_values * torch.tensor(std).view(1, 3, 1, 1) * 255.0  # (1, 3, S, S)


def test_upscaled_pixels_equal_the_pil_backend_and_stay_near_the_torchvision_one(clip: Path):
    preprocess = load_pretrained(str(clip)).config.preprocess
    pil, torchvision = CLIPImageProcessorPil.from_pretrained(str(clip)), CLIPImageProcessor.from_pretrained(str(clip))
    num_differing_images = 0
    for data in _png_images():
        ours_uint8 = torch.from_numpy(cpu_decode_to_input(data, preprocess))[None]  # (1, S, S, 3)
        ours = preprocess_uint8(ours_uint8, preprocess.mean, preprocess.std, torch.float32)  # (1, 3, S, S)
        want_pil = pil(images=_decoded(data), return_tensors="pt")["pixel_values"]
        want_torchvision = torchvision(images=_decoded(data), return_tensors="pt")["pixel_values"]
        torch.testing.assert_close(ours, want_pil, rtol=0, atol=1e-5)
        levels = (_levels(ours, preprocess.std) - _levels(want_torchvision, preprocess.std)).abs()
        assert levels.max().item() <= MAX_LEVELS_BETWEEN_BACKENDS + 1e-3
        assert (levels > 0.5).float().mean().item() <= MAX_SHARE_DIFFERENT
        num_differing_images += bool((levels > 0.5).any())
    assert num_differing_images > 0  # the backends do differ: the bound is about something real


def test_upscaled_scores_equal_transformers_with_its_pil_backend(clip: Path):
    bundle = load_pretrained(str(clip))
    model = AutoModel.from_pretrained(str(clip)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(clip))
    pil = CLIPImageProcessorPil.from_pretrained(str(clip))
    encoded = _png_images()
    pixel_values = pil(images=[_decoded(data) for data in encoded], return_tensors="pt")["pixel_values"]
    text_inputs = tokenizer([TEXT] * len(encoded), return_tensors="pt", padding=True)
    with torch.no_grad():
        want = model(pixel_values=pixel_values, **text_inputs).logits_per_image.diagonal()  # (N,)

    uint8 = torch.from_numpy(np.stack([cpu_decode_to_input(data, bundle.config.preprocess) for data in encoded]))
    images = bundle.model.encode_images(uint8)
    token_ids = bundle.tokenizer.encode(TEXT, truncate=True).token_ids
    texts = bundle.model.encode_texts([token_ids] * len(encoded), pad_to=bundle.model.text.fixed_length,
                                      pad_token_id=bundle.tokenizer.pad_token_id)
    got = torch.stack([fused.score for fused in bundle.model.fuse(images, texts)])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_against_the_torchvision_backend_embeddings_stay_equal_and_scores_within_the_readme_bound(clip: Path):
    model = AutoModel.from_pretrained(str(clip)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(clip))
    decoded = [_decoded(data) for data in _png_images()]
    pil, torchvision = CLIPImageProcessorPil.from_pretrained(str(clip)), CLIPImageProcessor.from_pretrained(str(clip))
    text_inputs = tokenizer([TEXT] * len(decoded), return_tensors="pt", padding=True)
    with torch.no_grad():
        ours = model(pixel_values=pil(images=decoded, return_tensors="pt")["pixel_values"], **text_inputs)
        default = model(pixel_values=torchvision(images=decoded, return_tensors="pt")["pixel_values"], **text_inputs)
    cosines = torch.nn.functional.cosine_similarity(ours.image_embeds, default.image_embeds, dim=-1)  # (N,)
    score_gaps = (ours.logits_per_image.diagonal() - default.logits_per_image.diagonal()).abs()  # (N,)
    cosine_gaps = score_gaps / model.logit_scale.exp()  # (N,) the image-text cosine's move
    assert cosines.min().item() >= 0.99999
    assert cosine_gaps.max().item() <= README_COSINE_GAP
    assert score_gaps.max().item() > 1e-4  # what the issue saw: beyond the 1e-4 that holds against the PIL backend
