"""Zero-shot scores of many images against many texts in one matrix product, as the model's own pipeline gives them.

    image embeddings (N, E) ─┐
                             ├─ cos (N, L) = normalize(I) @ normalize(T).T          one matrix product
    text embeddings  (L, E) ─┘      logits = exp(logit_scale) * cos (+ logit_bias)   ``logits_per_image``

    classify   siglip_sigmoid   sigmoid(logits)             each label on its own (the pipeline's sigmoid)
               clip_logit       softmax(logits, over L)     the labels share one unit (the pipeline's softmax)
    rank       the family's per-pair score, as ``/v1/infer`` gives it (``models.scores``)

The scale and bias are the model's own parameters (``CalibratedScore.owner``),
so these are the entries of ``logits_per_image`` that transformers'
``zero-shot-image-classification`` pipeline computes, without running the
towers again: the embeddings come from the segment cache or the lanes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from models.scores import CalibratedScore, ScoreKind
from models.torch_free.ranking import best_first as best_first  # re-exported: the pipelines' order


class ClassifyScoreKind(enum.StrEnum):
    """What a classify score is: one probability per label, or a distribution over the labels."""

    SIGMOID = "sigmoid"
    SOFTMAX = "softmax"


def classify_score_kind(kind: ScoreKind) -> ClassifyScoreKind:
    """The pipeline's normalisation for a family: SigLIP's sigmoid per label, CLIP's softmax over the labels."""
    return ClassifyScoreKind.SIGMOID if kind is ScoreKind.SIGLIP_SIGMOID else ClassifyScoreKind.SOFTMAX


@torch.inference_mode()
def logits_per_image(score: CalibratedScore, image_embeddings: torch.Tensor,
                     text_embeddings: torch.Tensor) -> torch.Tensor:
    """(N, E) and (L, E) -> (N, L) float32: the model's ``logits_per_image`` for every pair.

    Computed in float32 whatever the model's dtype: the matrix is small and
    the 1e-5 agreement with the pipeline is a float32 bound.
    """
    owner = score.owner
    images = F.normalize(image_embeddings.float(), dim=-1)  # (N, E)
    texts = F.normalize(text_embeddings.float(), dim=-1)  # (L, E)
    logits = images @ texts.T * owner.logit_scale.float().exp().reshape(())  # (N, L)
    bias = getattr(owner, "logit_bias", None)
    if bias is not None:
        logits = logits + bias.float().reshape(())
    return logits


@torch.inference_mode()
def classify_scores(score: CalibratedScore, image_embeddings: torch.Tensor,
                    text_embeddings: torch.Tensor) -> torch.Tensor:
    """(N, E) images x (L, E) labels -> (N, L) on the host: sigmoid per label (SigLIP) or softmax over labels (CLIP)."""
    logits = logits_per_image(score, image_embeddings, text_embeddings)  # (N, L)
    if classify_score_kind(score.kind) is ClassifyScoreKind.SIGMOID:
        return torch.sigmoid(logits).cpu()
    return logits.softmax(dim=-1).cpu()


@torch.inference_mode()
def pair_scores(score: CalibratedScore, image_embeddings: torch.Tensor,
                text_embeddings: torch.Tensor) -> torch.Tensor:
    """(N, E) x (L, E) -> (N, L) on the host: each pair's score as ``/v1/infer`` gives it (a probability or a logit)."""
    logits = logits_per_image(score, image_embeddings, text_embeddings)  # (N, L)
    return (torch.sigmoid(logits) if score.kind is ScoreKind.SIGLIP_SIGMOID else logits).cpu()


def stack_embeddings(embeddings: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-item (E,) embeddings, all on one device -> (K, E)."""
    return torch.stack(list(embeddings))  # (K, E)
