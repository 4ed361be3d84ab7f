"""A pretrained model's own image–text score, as its library computes it.

    siglip_sigmoid   sigmoid(exp(logit_scale) * cos(image, text) + logit_bias)   a probability
    clip_logit       exp(logit_scale) * cos(image, text)                          a logit, not a probability

These are the entries of ``logits_per_image`` (after the sigmoid SigLIP's
model card applies) for one image and one text. The scale and bias are the
model's own parameters, read at call time so they follow the model's device
and dtype, and computed in float32 whatever the model's dtype (the
embeddings are float32 already; the scale and bias are read up to float32),
so a half-precision model's score errs only by its embeddings' error. Models without a calibrated score (the presets, a timm ViT paired
with a separate text encoder) have none: only a trained fusion head's
``match_score`` says whether a text fits an image there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class ScoreKind(enum.StrEnum):
    SIGLIP_SIGMOID = "siglip_sigmoid"
    CLIP_LOGIT = "clip_logit"


@dataclass(frozen=True, eq=False)
class CalibratedScore:
    """``kind`` computed with ``owner``'s ``logit_scale`` (and ``logit_bias``)."""

    kind: ScoreKind
    owner: nn.Module

    def __call__(self, image_embedding: torch.Tensor, text_embedding: torch.Tensor) -> torch.Tensor:
        """(B, E) and (B, E) -> (B,)."""
        cos = F.cosine_similarity(image_embedding.float(), text_embedding.float(), dim=-1)  # (B,)
        logits = cos * self.owner.logit_scale.float().exp().reshape(())
        bias = getattr(self.owner, "logit_bias", None)
        if bias is not None:
            logits = logits + bias.float().reshape(())
        return torch.sigmoid(logits) if self.kind is ScoreKind.SIGLIP_SIGMOID else logits
