"""Whether a trained fusion head learned something: the rule, and what to tell the user when it did not.

A head is kept as trained only when, on the held-out pairs (images it never
saw, not even for validation),

    AUC >= max(MIN_HELD_OUT_AUC (0.6), 0.5 + CHANCE_SIGMAS (3.1) x sigma)
    and AUC - AUC of the untrained head >= MIN_AUC_GAIN (0.05)

where the untrained head is the same head before its first step, scored on
the same pairs, and sigma = sqrt((m + n + 1) / (12 m n)) is the standard
deviation of the AUC of scores that know nothing, over m matching and n
mismatched pairs (the Mann–Whitney statistic under the null): a head with
no signal passes about once in a thousand runs, however few the held-out
pairs. The floor is 0.6 from about 160 pairs of each class up (90 + 90:
0.634; 24 + 24, a fifth of 120 images: 0.761). An AUC of 0.5 is chance; a head whose scores order
pairs no better than its own random start has learned nothing that serving
should offer as a probability. Otherwise ``mmserve train-fusion`` exits 3 and
writes the model card but no head (unless ``--keep-untrained-result``: then
the file is written marked untrained, and the server serves no
``match_score`` from it).

An AUC cannot exceed 1, and on few held-out pairs the chance floor does
(2 + 2: 1.50): no head could pass, so ``is_passable`` is checked before
training and such an input is refused (``mmserve train-fusion`` exits 2).
With as many mismatched as matching pairs the floor first reaches 1 at
``min_held_out_pairs_per_class()`` (7) of each: 0.995, so only a perfect
ordering passes; at 11 + 11 it is 0.89.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_HELD_OUT_AUC = 0.6
MIN_AUC_GAIN = 0.05
CHANCE_SIGMAS = 3.1  # one-sided: P(z >= 3.1) ~ 0.001
RULE = (f"held-out AUC >= max({MIN_HELD_OUT_AUC}, 0.5 + {CHANCE_SIGMAS} x the AUC's standard deviation under "
        f"chance) and at least {MIN_AUC_GAIN} above the untrained head's on the same held-out pairs")


@dataclass(frozen=True)
class Verdict:
    is_learned: bool
    held_out_auc: float
    untrained_auc: float
    min_auc: float  # the floor for these held-out counts
    rule: str = RULE

    def describe(self) -> str:
        """One sentence: what was measured against the rule."""
        outcome = "meets" if self.is_learned else "does not meet"
        return (f"held-out AUC {self.held_out_auc:.3f} against {self.untrained_auc:.3f} for the untrained head "
                f"{outcome} the rule: at least {self.min_auc:.3f} (for these held-out pairs) and at least "
                f"{MIN_AUC_GAIN} above the untrained head's")


def chance_sigma(num_matching: int, num_mismatched: int) -> float:
    """The standard deviation of the AUC of uninformative scores over these counts (Mann–Whitney, no ties)."""
    m, n = num_matching, num_mismatched
    return math.sqrt((m + n + 1) / (12.0 * m * n))


def min_held_out_auc(num_matching: int, num_mismatched: int) -> float:
    return max(MIN_HELD_OUT_AUC, 0.5 + CHANCE_SIGMAS * chance_sigma(num_matching, num_mismatched))


def is_passable(num_matching: int, num_mismatched: int) -> bool:
    """Whether any AUC (at most 1.0) can meet the floor for these held-out counts."""
    return num_matching > 0 and num_mismatched > 0 and min_held_out_auc(num_matching, num_mismatched) <= 1.0


def min_held_out_pairs_per_class() -> int:
    """The fewest held-out pairs of each class, as many mismatched as matching, that ``is_passable``: 7."""
    num = 1
    while not is_passable(num, num):
        num += 1
    return num


def judge(held_out_auc: float, untrained_auc: float, num_matching: int, num_mismatched: int) -> Verdict:
    """The verdict; the counts must be ``is_passable`` (the caller refuses smaller held-out sets up front)."""
    if not is_passable(num_matching, num_mismatched):
        raise ValueError(f"no AUC can meet the rule on {num_matching} matching and {num_mismatched} mismatched "
                         "held-out pairs; check is_passable before training")
    floor = min_held_out_auc(num_matching, num_mismatched)
    is_learned = held_out_auc >= floor and held_out_auc - untrained_auc >= MIN_AUC_GAIN
    return Verdict(is_learned=is_learned, held_out_auc=held_out_auc, untrained_auc=untrained_auc, min_auc=floor)


def advice(*, num_pairs: int, num_images: int, learning_rate: float, learning_rate_from: str, num_epochs_run: int,
           best_epoch: int, best_validation_auc: float | None) -> str:
    """What to try next, with the figures of this run."""
    validation = ("" if best_validation_auc is None
                  else f"; its best validation AUC was {best_validation_auc:.3f}, at epoch {best_epoch}")
    return (f"This run trained {num_epochs_run} epochs at a peak learning rate of {learning_rate:.3g} "
            f"(from {learning_rate_from}) on {num_pairs} pairs of {num_images} images{validation}. Try: more pairs "
            "(a few hundred images at least, each caption on several images); check that each text describes its "
            "image (a shuffled file cannot be learned); a lower --lr (e.g. a third of this one) if the validation "
            "AUC rose and fell, or more --epochs if it was still rising at the end. "
            "--keep-untrained-result writes the head anyway, marked untrained (served without match_score).")
