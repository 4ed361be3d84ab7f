"""``MultimodalModel.fuse_multi``: one text with 0 to 4 images, fused in a batch or alone, on both backends."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from models.multimodal import FusedOutput, ImageSegment, MultimodalModel, TextSegment
from models.loading.repository import build_preset
from models.scores import CalibratedScore, ScoreKind

# Images per text: one, none, four, two, three (indices into the encoded images).
IMAGE_SETS = [[0], [], [1, 2, 3, 4], [5, 0], [6, 2, 1]]
TEXTS = ["a kite over the beach", "no picture at all", "x", "two dogs and a cat on a sofa", "red"]


class _ScoreOwner(nn.Module):
    """Stands in for a pretrained model that owns a SigLIP-style logit scale and bias."""

    def __init__(self) -> None:
        super().__init__()
        self.logit_scale = nn.Parameter(torch.tensor(2.3))
        self.logit_bias = nn.Parameter(torch.tensor(-1.0))


@dataclass(frozen=True)
class _TruncatedScore:
    """A SigLIP-style calibrated score for the tiny preset (its image embeddings, 64, are wider than its texts')."""

    calibrated: CalibratedScore

    def __call__(self, image_embedding: torch.Tensor, text_embedding: torch.Tensor) -> torch.Tensor:
        return self.calibrated(image_embedding[:, : text_embedding.shape[1]], text_embedding)  # (N,)


def _model(backend: str = "torch") -> tuple[MultimodalModel, list[ImageSegment], list[TextSegment]]:
    bundle = build_preset("tiny", seed=0, backend=backend)
    model = bundle.model
    model.score = _TruncatedScore(CalibratedScore(ScoreKind.SIGLIP_SIGMOID, _ScoreOwner()))
    size = bundle.config.preprocess.input_size
    pixels = torch.randint(0, 256, (7, size, size, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    images = model.encode_images(pixels)
    texts = model.encode_texts([bundle.tokenizer.encode(t, truncate=False).token_ids for t in TEXTS])
    return model, images, texts


def _image_sets(images: list[ImageSegment]) -> list[list[ImageSegment]]:
    return [[images[j] for j in indices] for indices in IMAGE_SETS]


@pytest.fixture(scope="module")
def torch_model() -> tuple[MultimodalModel, list[ImageSegment], list[TextSegment]]:
    return _model("torch")


def _assert_close(a: FusedOutput, b: FusedOutput, atol: float) -> None:
    torch.testing.assert_close(a.fused, b.fused, rtol=0, atol=atol)
    torch.testing.assert_close(a.match_score, b.match_score, rtol=0, atol=atol)
    assert (a.score is None) == (b.score is None)
    if a.score is not None:
        torch.testing.assert_close(a.score, b.score, rtol=0, atol=atol)
    torch.testing.assert_close(a.image_scores, b.image_scores, rtol=0, atol=atol)


def test_a_request_fused_in_a_batch_equals_it_fused_alone(torch_model) -> None:
    model, images, texts = torch_model
    batched = model.fuse_multi(_image_sets(images), texts)
    assert len(batched) == len(texts)
    for i, image_set in enumerate(_image_sets(images)):
        _assert_close(batched[i], model.fuse_multi([image_set], [texts[i]])[0], atol=1e-6)


def test_one_image_per_text_is_todays_fuse_exactly(torch_model) -> None:
    """K = 1: bit for bit what fuse computed before ragged keys (dense keys, the images' own embeddings)."""
    model, images, texts = torch_model
    pairs = images[:5]
    with torch.inference_mode():
        q = torch.cat([t.q for t in texts])  # (T, r)
        cu_seqlens_q = torch.tensor([0, *torch.tensor([t.num_tokens for t in texts]).cumsum(0)], dtype=torch.int32)
        text_embeddings = torch.stack([t.pooled for t in texts])  # (B, E_t)
        image_embeddings = torch.stack([s.pooled for s in pairs])  # (B, E_v)
        before = model.fusion(q, cu_seqlens_q, torch.stack([s.k for s in pairs]), torch.stack([s.v for s in pairs]),
                              text_embeddings, image_embeddings)  # dense k (B, Lv, r), v (B, Lv, d_v)
        scores = model.score(image_embeddings, text_embeddings)  # (B,)
    for fuse_output in (model.fuse(pairs, texts), model.fuse_multi([[s] for s in pairs], texts)):
        for i, out in enumerate(fuse_output):
            assert torch.equal(out.fused, before.fused[i])
            assert torch.equal(out.match_score, before.match_score[i])
            assert torch.equal(out.score, scores[i])
            assert torch.equal(out.image_scores, scores[i : i + 1])


def test_the_score_is_the_best_image_score_and_each_image_keeps_its_own(torch_model) -> None:
    model, images, texts = torch_model
    batched = model.fuse_multi(_image_sets(images), texts)
    for i, indices in enumerate(IMAGE_SETS):
        assert batched[i].image_scores.shape == (len(indices),)
        for position, j in enumerate(indices):  # the score of the text with that image alone
            torch.testing.assert_close(batched[i].image_scores[position], model.fuse([images[j]], [texts[i]])[0].score,
                                       rtol=0, atol=1e-6)
        if indices:
            assert torch.equal(batched[i].score, batched[i].image_scores.max())


def test_the_head_compares_with_the_mean_of_the_images_embeddings(torch_model) -> None:
    model, images, texts = torch_model
    out = model.fuse_multi([[images[1], images[2], images[3]]], [texts[2]])[0]
    with torch.inference_mode():
        mean_image = torch.stack([images[j].pooled for j in (1, 2, 3)]).mean(0)  # (E_v,)
        head_score = F.cosine_similarity(out.fused, model.fusion.image_proj(mean_image), dim=0)
        expected = torch.sigmoid(model.fusion.match_logit_scale * head_score + model.fusion.match_logit_bias)
    torch.testing.assert_close(out.match_score, expected, rtol=0, atol=1e-6)


def test_a_text_without_images_attends_to_nothing(torch_model) -> None:
    """0 images: fused = LayerNorm(b_o + text embedding), head score 0, no calibrated score, no image scores."""
    model, images, texts = torch_model
    for batch in ([[]], [[], [images[0]]]):
        out = model.fuse_multi(batch, texts[: len(batch)])[0]
        with torch.inference_mode():
            expected = model.fusion.norm(model.fusion.out_proj.bias + texts[0].pooled)
        torch.testing.assert_close(out.fused, expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(out.match_score, torch.sigmoid(model.fusion.match_logit_bias.detach()),
                                   rtol=0, atol=1e-6)
        assert out.score is None
        assert out.image_scores.shape == (0,)


def test_without_a_calibrated_score_there_are_no_image_scores() -> None:
    bundle = build_preset("tiny", seed=0)
    size = bundle.config.preprocess.input_size
    images = bundle.model.encode_images(torch.zeros(2, size, size, 3, dtype=torch.uint8))
    texts = bundle.model.encode_texts([[5, 6, 7]])
    out = bundle.model.fuse_multi([images], texts)[0]
    assert out.score is None and out.image_scores is None


def test_arguments_must_pair_up(torch_model) -> None:
    model, images, texts = torch_model
    assert model.fuse_multi([], []) == []
    with pytest.raises(ValueError, match="2 image lists but 1 text segments"):
        model.fuse_multi([[images[0]], []], texts[:1])


def test_torch_and_triton_backends_agree(monkeypatch: pytest.MonkeyPatch, torch_model) -> None:
    """The Triton kernel (interpreted on the CPU) over ragged keys gives the torch backend's answers."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    model, images, texts = torch_model
    triton_model, triton_images, triton_texts = _model("triton")
    assert triton_model.fusion.backend == "triton"
    with_torch = model.fuse_multi(_image_sets(images), texts)
    with_triton = triton_model.fuse_multi(_image_sets(triton_images), triton_texts)
    for ours, theirs in zip(with_torch, with_triton, strict=True):
        _assert_close(ours, theirs, atol=1e-5)
