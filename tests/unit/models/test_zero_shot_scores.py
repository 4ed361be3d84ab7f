"""``models.zero_shot``: the many-by-many scores equal the model's per-pair score and its pipeline's normalisation."""

from __future__ import annotations

import torch
from torch import nn

from models.scores import CalibratedScore, ScoreKind
from models.zero_shot import best_first, classify_score_kind, classify_scores, logits_per_image, pair_scores


def _owner(scale: float, bias: float | None) -> nn.Module:
    owner = nn.Module()
    owner.logit_scale = nn.Parameter(torch.tensor([scale]))
    if bias is not None:
        owner.logit_bias = nn.Parameter(torch.tensor([bias]))
    return owner


def test_the_matrix_equals_the_per_pair_score_for_both_families():
    torch.manual_seed(0)
    images, texts = torch.randn(3, 8), torch.randn(5, 8)  # not normalised: the score normalises
    for kind, bias in ((ScoreKind.SIGLIP_SIGMOID, -1.5), (ScoreKind.CLIP_LOGIT, None)):
        score = CalibratedScore(kind, _owner(2.3, bias))
        matrix = pair_scores(score, images, texts)  # (3, 5)
        for i in range(3):
            want = score(images[i].expand(5, 8), texts)  # (5,)
            torch.testing.assert_close(matrix[i], want, rtol=0, atol=1e-6)


def test_classify_is_sigmoid_per_label_for_siglip_and_softmax_over_labels_for_clip():
    torch.manual_seed(1)
    images, texts = torch.randn(2, 4), torch.randn(6, 4)
    siglip = CalibratedScore(ScoreKind.SIGLIP_SIGMOID, _owner(1.0, 0.5))
    clip = CalibratedScore(ScoreKind.CLIP_LOGIT, _owner(3.0, None))
    torch.testing.assert_close(classify_scores(siglip, images, texts),
                               torch.sigmoid(logits_per_image(siglip, images, texts)))
    probabilities = classify_scores(clip, images, texts)
    torch.testing.assert_close(probabilities.sum(dim=-1), torch.ones(2))
    torch.testing.assert_close(probabilities, logits_per_image(clip, images, texts).softmax(dim=-1))
    assert (classify_score_kind(siglip.kind).value, classify_score_kind(clip.kind).value) == ("sigmoid", "softmax")


def test_best_first_keeps_ties_in_their_given_order_and_cuts_to_top_k():
    scores = [0.2, 0.9, 0.2, 0.5, 0.9]
    assert best_first(scores) == [1, 4, 3, 0, 2]
    assert best_first(scores, top_k=2) == [1, 4]
