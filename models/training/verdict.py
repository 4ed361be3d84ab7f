"""Whether a trained fusion head learned something: the rule, and what to tell the user when it did not.

A head is kept as trained only when, on the held-out pairs (images it never
saw, not even for validation),

    AUC >= MIN_HELD_OUT_AUC (0.6)   and   AUC - AUC of the untrained head >= MIN_AUC_GAIN (0.05)

where the untrained head is the same head before its first step, scored on
the same pairs. An AUC of 0.5 is chance; a head whose scores order pairs no
better than its own random start has learned nothing that serving should
offer as a probability. Otherwise ``mmserve train-fusion`` exits 3 and
writes the model card but no head (unless ``--keep-untrained-result``: then
the file is written marked untrained, and the server serves no
``match_score`` from it).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_HELD_OUT_AUC = 0.6
MIN_AUC_GAIN = 0.05
RULE = (f"held-out AUC >= {MIN_HELD_OUT_AUC} and at least {MIN_AUC_GAIN} above the untrained head's "
        "on the same held-out pairs")


@dataclass(frozen=True)
class Verdict:
    is_learned: bool
    held_out_auc: float
    untrained_auc: float
    rule: str = RULE

    def describe(self) -> str:
        """One sentence: what was measured against the rule."""
        outcome = "meets" if self.is_learned else "does not meet"
        return (f"held-out AUC {self.held_out_auc:.3f} against {self.untrained_auc:.3f} for the untrained head "
                f"{outcome} the rule ({self.rule})")


def judge(held_out_auc: float, untrained_auc: float) -> Verdict:
    is_learned = held_out_auc >= MIN_HELD_OUT_AUC and held_out_auc - untrained_auc >= MIN_AUC_GAIN
    return Verdict(is_learned=is_learned, held_out_auc=held_out_auc, untrained_auc=untrained_auc)


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
