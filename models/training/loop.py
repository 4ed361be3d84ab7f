"""Training the low-rank fusion head on frozen tower features, and judging it on held-out pairs.

Only the head's parameters learn; the towers' outputs are fixed tensors
(``models.training.features``), so an epoch costs the head's own work: the
K/V/Q projections, the cross-attention (the torch reference, which autograd
differentiates; the Triton kernel has no backward) and the pooled head.

    logit = match_logit_scale * score + match_logit_bias      (what serving's sigmoid reads)
    loss  = BCE(logit, label)                                 label 1: the text describes the image

AdamW, weight decay on the matrices only (not on biases, the LayerNorm or
the two scalars), gradients clipped to norm 1, the learning rate and the
budget of steps from ``models.training.plan``, minibatches shuffled by a
seeded generator: the same seed, pairs and towers give the same head (on
the same torch build and thread count).

After every epoch the head is judged on the validation pairs (images carved
from the training images, never the held-out ones): the curve goes into the
model card, the weights of the best epoch (highest validation AUC, then
lowest validation loss) are kept, and training stops once the AUC has not
improved for ``plan.patience_steps`` steps. Without validation pairs the
last epoch's weights are kept.

Cost: an epoch is dominated by the value projection of every example's
image tokens (B x Lv x d_v x d_v); at ViT-B/16 widths (Lv 197, d_v 768) a
batch of 64 takes about a second on two CPU cores
(whole runs: BENCHMARKS.md, history, ``train_fusion_time.py``).

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
from models.training.pairs import ImageTextPair, captions_by_image, count_near_duplicates, sample_mismatches
from models.training.plan import TrainingPlan
from models.training.progress import ProgressFactory, silent_progress


_MAX_GRAD_NORM = 1.0  # one odd batch early on (the logit scale starts at 10) must not throw the head off


@dataclass(frozen=True)
class TrainingConfig:
    """What the user asked for; None: chosen from the data (``models.training.plan``)."""

    epochs: int | None = None
    learning_rate: float | None = None
    weight_decay: float = 0.01
    batch_size: int = 64
    held_out_fraction: float = 0.2
    validation_fraction: float = 0.15  # of the training images, to choose the epoch and stop early
    seed: int = 0

    def __post_init__(self) -> None:
        if ((self.epochs is not None and self.epochs < 1) or self.batch_size < 1
                or (self.learning_rate is not None and not self.learning_rate > 0)):
            raise ValueError(f"epochs and batch_size must be >= 1 and learning_rate > 0, got {self}")
        if not 0.0 < self.validation_fraction < 1.0:
            raise ValueError(f"validation_fraction must be in (0, 1), got {self.validation_fraction}")


@dataclass(frozen=True)
class Evaluation:
    """How well a head separates matching from mismatched pairs."""

    auc: float
    accuracy: float  # match_score >= 0.5 taken as "matches"
    num_matching: int
    num_mismatched: int
    loss: float = float("nan")  # mean binary cross-entropy of the match logits


@dataclass(frozen=True)
class EpochRecord:
    """One point of the validation curve."""

    epoch: int  # 1-based
    step: int  # optimizer steps taken so far
    train_loss: float  # mean over the epoch's examples
    learning_rate: float  # at the epoch's last step
    validation_auc: float | None
    validation_loss: float | None


@dataclass(frozen=True)
class TrainingRun:
    """How training went; the head holds the kept weights."""

    curve: tuple[EpochRecord, ...]
    best_epoch: int  # whose weights the head holds
    num_steps: int  # optimizer steps taken
    is_stopped_early: bool
    num_sampled_mismatches: int  # over all epochs; 0 when the file's labels are used
    num_near_duplicate_mismatches: int  # of those, near-duplicates of the image's caption (pairs.is_near_duplicate)

    @property
    def final_loss(self) -> float:
        return self.curve[-1].train_loss


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
    loss = float(F.binary_cross_entropy_with_logits(logits, examples.labels))
    return Evaluation(auc=roc_auc(logits, examples.labels), accuracy=accuracy, num_matching=num_matching,
                      num_mismatched=len(examples) - num_matching, loss=loss)


def _optimizer(head: LowRankCrossAttention, weight_decay: float, learning_rate: float) -> torch.optim.Optimizer:
    matrices = [p for p in head.parameters() if p.ndim >= 2]
    others = [p for p in head.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": matrices, "weight_decay": weight_decay},
                              {"params": others, "weight_decay": 0.0}], lr=learning_rate)


def _is_better(candidate: Evaluation, best: Evaluation | None) -> bool:
    return best is None or (candidate.auc, -candidate.loss) > (best.auc, -best.loss)


def train_head(head: LowRankCrossAttention, features: TowerFeatures, train_pairs: Sequence[ImageTextPair], *,
               validation_pairs: Sequence[ImageTextPair] | None, sample_texts: Sequence[str] | None,
               plan: TrainingPlan, config: TrainingConfig,
               progress: ProgressFactory = silent_progress) -> TrainingRun:
    """Train ``head`` in place on ``train_pairs`` by ``plan``; it ends holding the best epoch's weights.

    ``validation_pairs`` (both classes) choose the epoch and stop early;
    None keeps the last epoch. ``sample_texts``: draw one mismatched pair per
    matching pair each epoch from these texts (the file has no labelled
    mismatches); None trains on ``train_pairs`` as they are.
    """
    optimizer = _optimizer(head, config.weight_decay, plan.learning_rate_at(0))
    generator = torch.Generator().manual_seed(config.seed)
    rng = random.Random(f"{config.seed}:train mismatches")
    described = captions_by_image(train_pairs)
    bar = progress("training the head", plan.num_steps)
    curve: list[EpochRecord] = []
    best: Evaluation | None = None
    best_state: dict[str, torch.Tensor] | None = None
    best_epoch, best_step, step = 0, 0, 0
    num_sampled, num_near_duplicate = 0, 0
    is_stopped_early = False
    while step < plan.num_steps and not is_stopped_early:
        head.train()
        pairs = list(train_pairs)
        if sample_texts is not None:
            mismatches = sample_mismatches(train_pairs, sample_texts, rng)
            num_sampled += len(mismatches)
            num_near_duplicate += count_near_duplicates(mismatches, described)
            pairs += mismatches
        examples = examples_of(pairs, features)
        order = torch.randperm(len(examples), generator=generator)  # (N,)
        total_loss, num_seen = 0.0, 0
        for start in range(0, len(examples), config.batch_size):
            if step >= plan.num_steps:
                break
            for group in optimizer.param_groups:
                group["lr"] = plan.learning_rate_at(step)
            rows = order[start: start + config.batch_size]  # (b,)
            logits = match_logits(head, features, examples.image_indices[rows], examples.text_indices[rows])
            loss = F.binary_cross_entropy_with_logits(logits, examples.labels[rows].to(logits.device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), _MAX_GRAD_NORM)
            optimizer.step()
            total_loss += float(loss.detach()) * rows.numel()
            num_seen += rows.numel()
            step += 1
            bar.update(1)
        epoch = len(curve) + 1
        validation = evaluate(head, features, validation_pairs) if validation_pairs is not None else None
        curve.append(EpochRecord(epoch=epoch, step=step, train_loss=total_loss / max(1, num_seen),
                                 learning_rate=plan.learning_rate_at(step - 1),
                                 validation_auc=None if validation is None else validation.auc,
                                 validation_loss=None if validation is None else validation.loss))
        if validation is None:
            best_epoch = epoch
        elif _is_better(validation, best):
            best, best_epoch, best_step = validation, epoch, step
            best_state = {name: t.detach().clone() for name, t in head.state_dict().items()}
        elif step - best_step >= plan.patience_steps:
            is_stopped_early = True
        bar.set_postfix_str(f"loss {curve[-1].train_loss:.4f}"
                            + ("" if validation is None else f", validation AUC {validation.auc:.3f}"))
    bar.close()
    if best_state is not None:
        head.load_state_dict(best_state)
    head.eval()
    return TrainingRun(curve=tuple(curve), best_epoch=best_epoch, num_steps=step, is_stopped_early=is_stopped_early,
                       num_sampled_mismatches=num_sampled, num_near_duplicate_mismatches=num_near_duplicate)
