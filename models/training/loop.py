"""Training the low-rank fusion head on frozen tower features, and judging it on held-out pairs.

Only the head's parameters learn; the towers' outputs are fixed tensors
(``models.training.features``), so an epoch costs the head's own work: the
K/V/Q projections, the cross-attention (the torch reference, which autograd
differentiates; the Triton kernel has no backward) and the pooled head.

    logit = match_logit_scale * score + match_logit_bias      (what serving's sigmoid reads)
    loss  = BCE(logit, label)                                 label 1: the text describes the image

AdamW, weight decay on the matrices only (not on biases, the LayerNorm or
the two scalars), gradients clipped to norm 1, minibatches shuffled by a
seeded generator: the same seed, pairs and towers give the same head (on
the same torch build and thread count).

Cost: an epoch is dominated by the value projection of every example's
image tokens (B x Lv x d_v x d_v); at ViT-B/16 widths (Lv 197, d_v 768) a
batch of 64 takes about a second on two CPU cores, so 2,000 pairs (4,000
examples with their sampled mismatches) train 10 epochs in about ten
minutes.

``roc_auc`` is the probability that a random matching pair scores above a
random mismatched one (ties count a half): the Mann–Whitney rank formula,
so nothing beyond torch is needed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from models.fusion import LowRankCrossAttention
from models.training.features import TowerFeatures
from models.training.pairs import ImageTextPair, sample_mismatches
from models.training.progress import ProgressFactory, silent_progress


_MAX_GRAD_NORM = 1.0  # one odd batch early on (the logit scale starts at 10) must not throw the head off


@dataclass(frozen=True)
class TrainingConfig:
    epochs: int = 10
    learning_rate: float = 3e-3
    weight_decay: float = 0.01
    batch_size: int = 64
    held_out_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or not self.learning_rate > 0:
            raise ValueError(f"epochs and batch_size must be >= 1 and learning_rate > 0, got {self}")


@dataclass(frozen=True)
class Evaluation:
    """How well a head separates matching from mismatched pairs."""

    auc: float
    accuracy: float  # match_score >= 0.5 taken as "matches"
    num_matching: int
    num_mismatched: int


@dataclass(frozen=True)
class _Examples:
    image_indices: torch.Tensor  # (N,) int64 rows of TowerFeatures.image_tokens
    text_indices: torch.Tensor  # (N,) int64 rows of TowerFeatures.text_offsets
    labels: torch.Tensor  # (N,) float32, 1 = matches

    def __len__(self) -> int:
        return int(self.labels.numel())


def examples_of(pairs: Sequence[ImageTextPair], features: TowerFeatures) -> _Examples:
    return _Examples(
        image_indices=torch.tensor([features.image_rows[p.image] for p in pairs], dtype=torch.long),
        text_indices=torch.tensor([features.text_rows[p.text] for p in pairs], dtype=torch.long),
        labels=torch.tensor([1.0 if p.is_match else 0.0 for p in pairs], dtype=torch.float32),
    )


def fresh_head(like: LowRankCrossAttention, seed: int) -> LowRankCrossAttention:
    """A head of ``like``'s shapes, initialised from ``seed``, on the torch reference (which has a backward)."""
    torch.manual_seed(seed)
    return LowRankCrossAttention(
        text_dim=like.q_proj.in_features, image_dim=like.k_proj.in_features, rank=like.rank, backend="torch",
        text_embedding_dim=like.out_proj.out_features, image_embedding_dim=like.image_proj.in_features,
    )


def match_logits(head: LowRankCrossAttention, features: TowerFeatures, image_indices: torch.Tensor,
                 text_indices: torch.Tensor) -> torch.Tensor:
    """The head's match logit for each (image, text) row pair: (B,)."""
    device = head.match_logit_scale.device
    text_rows, cu_seqlens_q = features.packed_text_rows(text_indices)
    q = head.project_text(features.text_tokens[text_rows].to(device))  # (T_b, r)
    k, v = head.project_image(features.image_tokens[image_indices].to(device))  # (B, Lv, r), (B, Lv, d_v)
    out = head(q, cu_seqlens_q.to(device), k, v, features.text_pooled[text_indices].to(device),
               features.image_pooled[image_indices].to(device))
    return head.match_logit_scale * out.score + head.match_logit_bias  # (B,)


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve of ``scores`` (N,) for binary ``labels`` (N,), by average ranks."""
    is_match = labels > 0.5
    num_matching, num_mismatched = int(is_match.sum()), int((~is_match).sum())
    if num_matching == 0 or num_mismatched == 0:
        raise ValueError(f"AUC needs both classes, got {num_matching} matching and {num_mismatched} mismatched")
    _, group, counts = torch.unique(scores.double(), return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, dim=0).double()  # (G,) the last 1-based rank of each group of equal scores
    ranks = (ends - (counts.double() - 1.0) / 2.0)[group]  # (N,) ties share their mean rank
    rank_sum = float(ranks[is_match].sum())
    return (rank_sum - num_matching * (num_matching + 1) / 2.0) / (num_matching * num_mismatched)


@torch.no_grad()
def evaluate(head: LowRankCrossAttention, features: TowerFeatures, pairs: Sequence[ImageTextPair],
             batch_size: int = 256) -> Evaluation:
    head.eval()
    examples = examples_of(pairs, features)
    logits = torch.cat([
        match_logits(head, features, examples.image_indices[s: s + batch_size],
                     examples.text_indices[s: s + batch_size]).cpu()
        for s in range(0, len(examples), batch_size)
    ])  # (N,)
    is_predicted_match = logits >= 0.0  # sigmoid(logit) >= 0.5
    accuracy = float((is_predicted_match == (examples.labels > 0.5)).double().mean())
    num_matching = int(examples.labels.sum())
    return Evaluation(auc=roc_auc(logits, examples.labels), accuracy=accuracy, num_matching=num_matching,
                      num_mismatched=len(examples) - num_matching)


def _optimizer(head: LowRankCrossAttention, config: TrainingConfig) -> torch.optim.Optimizer:
    matrices = [p for p in head.parameters() if p.ndim >= 2]
    others = [p for p in head.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": matrices, "weight_decay": config.weight_decay},
                              {"params": others, "weight_decay": 0.0}], lr=config.learning_rate)


def train_head(head: LowRankCrossAttention, features: TowerFeatures, train_pairs: Sequence[ImageTextPair], *,
               sample_texts: Sequence[str] | None, config: TrainingConfig,
               progress: ProgressFactory = silent_progress) -> float:
    """Train ``head`` in place on ``train_pairs``; returns the last epoch's mean loss.

    ``sample_texts``: draw one mismatched pair per matching pair each epoch
    from these texts (the file has no labelled mismatches); None trains on
    ``train_pairs`` as they are.
    """
    optimizer = _optimizer(head, config)
    generator = torch.Generator().manual_seed(config.seed)
    rng = random.Random(f"{config.seed}:train mismatches")
    num_examples = len(train_pairs) + (sum(p.is_match for p in train_pairs) if sample_texts is not None else 0)
    bar = progress("training the head", config.epochs * -(-num_examples // config.batch_size))
    head.train()
    epoch_loss = float("nan")
    for _ in range(config.epochs):
        pairs = list(train_pairs)
        if sample_texts is not None:
            pairs += sample_mismatches(train_pairs, sample_texts, rng)
        examples = examples_of(pairs, features)
        order = torch.randperm(len(examples), generator=generator)  # (N,)
        total_loss = 0.0
        for start in range(0, len(examples), config.batch_size):
            rows = order[start: start + config.batch_size]  # (b,)
            logits = match_logits(head, features, examples.image_indices[rows], examples.text_indices[rows])
            loss = F.binary_cross_entropy_with_logits(logits, examples.labels[rows].to(logits.device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), _MAX_GRAD_NORM)
            optimizer.step()
            total_loss += float(loss.detach()) * rows.numel()
            bar.update(1)
        epoch_loss = total_loss / len(examples)
        bar.set_postfix_str(f"loss {epoch_loss:.4f}")
    bar.close()
    head.eval()
    return epoch_loss
