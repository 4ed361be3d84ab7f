"""``mmserve train-fusion``: train the fusion head of a model on image–text pairs, write it and its card.

    DIR/
    ├── fusion_head.safetensors   the head (models.fusion_head_file): trained = "true", the towers
    │                             fingerprint, and the card below as its ``card`` metadata. Not written
    │                             when the head learned nothing (``models.training.verdict``), unless
    │                             --keep-untrained-result: then written with trained = "false".
    └── fusion_head_card.json     the model card, for people (always written):

    {"format": "mmserve-fusion-head-card", "format_version": "2",
     "model": "google/siglip-base-patch16-224",    as given to --model
     "model_directory": "/abs/dir", "family": "siglip", "rank": 16,
     "towers_fingerprint": "<64 hex>",            the towers it was trained on (the server checks it)
     "pairs": {"file": "/abs/pairs.jsonl", "sha256": "<64 hex>", "num_pairs": 3000,
               "mismatches": "sampled" | "labelled"},
     "split": {"by": "image", "held_out_fraction": 0.2, "validation_fraction": 0.15,
               "num_train_images": 680, "num_validation_images": 120, "num_held_out_images": 200},
     "train": {"num_matching": 2040, "num_mismatched": 2040},   per epoch (sampled afresh each epoch)
     "sampled_mismatches": {"near_duplicate": "token Jaccard >= 0.5 ...",
                            "train": {"num": 40800, "num_near_duplicate": 9000}, "validation": {...},
                            "held_out": {...}},                  only when mismatches are sampled
     "held_out": {"num_matching": 600, "num_mismatched": 600, "accuracy": 0.93, "auc": 0.98, "loss": 0.2},
     "untrained_held_out": {"accuracy": 0.5, "auc": 0.51, ...},  the same pairs, the head before training
     "auc_meaning": "...",                                        what the AUC says, in words
     "verdict": {"learned": true, "rule": "...", "summary": "..."},
     "training": {"epochs": 20, "learning_rate": 0.000625, "weight_decay": 0.01, "batch_size": 64, "seed": 0,
                  "chosen": {"budget_steps": 500, "budget_from": "data", "steps_per_epoch": 25,
                             "learning_rate_from": "head width", "warmup_steps": 25, "patience_steps": 125,
                             "schedule": "linear warm-up, then cosine to 0.1 of the peak",
                             "early_stopping": "..."},
                  "steps_run": 350, "epochs_run": 14, "best_epoch": 9, "stopped_early": true,
                  "final_loss": 0.12, "feature_seconds": 41.0, "training_seconds": 95.2},
     "validation_curve": [{"epoch": 1, "step": 25, "train_loss": 0.69, "learning_rate": 0.000625,
                           "validation_auc": 0.61, "validation_loss": 0.68}, ...],
     "trained_at": "2025-01-01T12:00:00+00:00"}

Serve the result by copying ``fusion_head.safetensors`` beside the model or
with ``mmserve serve --model M --fusion-head DIR/fusion_head.safetensors``.

Three disjoint sets of images: the held-out images (``--held-out-fraction``)
judge the finished head and nothing else; the validation images, carved from
the rest (``validation_fraction``), choose the epoch and stop training
early; the head learns from the remaining training images, by the budget
and learning-rate schedule of ``models.training.plan``.

The towers are loaded as serving loads them and stay frozen; their outputs
are computed once (``models.training.features``), and only the head learns
(``models.training.loop``). The towers must be float32 as loaded, which
every pretrained family is: the head file names the towers by the
fingerprint of their tensors as read, and a float16 / bfloat16 repository's
served tensors are not those.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from models.errors import ModelRepositoryError, TrainingDataError
from models.fusion_head_file import FUSION_HEAD_FILE, save_fusion_head
from models.families.pretrained import load_pretrained
from models.loading.repository import fingerprint
from models.training.features import compute_tower_features
from models.training.loop import Evaluation, TrainingConfig, TrainingRun, evaluate, fresh_head, train_head
from models.training.pairs import (
    NEAR_DUPLICATE_JACCARD, ImageTextPair, PairsFile, PairSplit, captions_by_image, count_near_duplicates,
    num_held_out_images, read_pairs, sample_mismatches, split_by_image,
)
from models.training.plan import FINAL_LR_FRACTION, TrainingPlan, plan_training
from models.training.progress import ProgressFactory, silent_progress
from models.training.verdict import Verdict, advice, is_passable, judge, min_held_out_pairs_per_class

CARD_FILE = "fusion_head_card.json"
CARD_FORMAT = "mmserve-fusion-head-card"
CARD_FORMAT_VERSION = "2"
AUC_MEANING = ("AUC is the probability that the head scores a matching (image, text) pair above a mismatched "
               "one, both drawn at random from the held-out images, which the head never saw: 0.5 is chance, "
               "1.0 a perfect ordering. It says how well match_score ranks, not whether 0.5 is the right "
               "threshold (that is the accuracy).")
NEAR_DUPLICATE_MEANING = (f"a sampled mismatch whose text shares at least {NEAR_DUPLICATE_JACCARD} of its words "
                          "(token Jaccard, lower-cased) with a caption of its image, e.g. 'a red square' for "
                          "'a red circle'")
VALIDATION_DRAWS = 3  # sampled mismatches per validation image: a steadier curve on few images
MIN_IMAGES_FOR_VALIDATION = 3  # fewer training images: no validation split, the last epoch is kept


@dataclass(frozen=True)
class TrainedHead:
    """What ``train_fusion`` wrote and how the head did on the held-out pairs."""

    head_path: Path | None  # None: the head learned nothing and was not written
    card_path: Path
    held_out: Evaluation
    untrained_held_out: Evaluation
    verdict: Verdict
    advice: str  # what to try, when the verdict is not learned
    card: dict[str, Any]


@dataclass(frozen=True)
class _Sets:
    """The three disjoint image sets, with the mismatches each evaluation uses."""

    train: tuple[ImageTextPair, ...]
    validation: tuple[ImageTextPair, ...] | None  # None: too few images or one class only
    validation_images: frozenset[Path]
    held_out: tuple[ImageTextPair, ...]
    held_out_images: frozenset[Path]
    sample_texts: list[str] | None  # None: the file's labels are used


def _has_both_classes(pairs: tuple[ImageTextPair, ...]) -> bool:
    return any(p.is_match for p in pairs) and not all(p.is_match for p in pairs)


def _check_both_classes(split: PairSplit, pairs_path: Path) -> None:
    for name, pairs in (("training", split.train), ("held-out", split.held_out)):
        if not _has_both_classes(pairs):
            raise TrainingDataError(f"{pairs_path}: the {name} images (split by image) do not have both matching "
                                    "and label-0 pairs; add label-0 lines for more images, or leave every label "
                                    "out to have mismatches sampled")


def _make_sets(pairs_file: PairsFile, config: TrainingConfig) -> _Sets:
    split = split_by_image(pairs_file.pairs, config.held_out_fraction, config.seed)
    sample_texts = None if pairs_file.has_mismatches else sorted({p.text for p in pairs_file.pairs})
    held_out = split.held_out
    if sample_texts is None:
        _check_both_classes(split, pairs_file.path)
    else:
        held_out += sample_mismatches(held_out, sample_texts, random.Random(f"{config.seed}:held-out"))
    train, validation = split.train, None
    if len({p.image for p in split.train}) >= MIN_IMAGES_FOR_VALIDATION:
        carved = split_by_image(split.train, config.validation_fraction, f"{config.seed}:validation")
        candidate = carved.held_out
        if sample_texts is not None:
            rng = random.Random(f"{config.seed}:validation")
            for _ in range(VALIDATION_DRAWS):
                candidate += sample_mismatches(carved.held_out, sample_texts, rng)
        if _has_both_classes(candidate) and (sample_texts is not None or _has_both_classes(carved.train)):
            train, validation = carved.train, candidate
    return _Sets(train=train, validation=validation,
                 validation_images=frozenset(p.image for p in validation or ()), held_out=held_out,
                 held_out_images=frozenset(p.image for p in split.held_out), sample_texts=sample_texts)


def _check_held_out_is_passable(sets: _Sets, pairs_file: PairsFile, config: TrainingConfig) -> None:
    """Refuse a held-out set so small that not even an AUC of 1.0 meets the verdict's chance floor."""
    num_matching = sum(p.is_match for p in sets.held_out)
    num_mismatched = len(sets.held_out) - num_matching
    if is_passable(num_matching, num_mismatched):
        return
    per_class = min_held_out_pairs_per_class()
    num_images = next(n for n in itertools.count(2) if num_held_out_images(n, config.held_out_fraction) >= per_class)
    raise TrainingDataError(
        f"{pairs_file.path}: too few held-out pairs to judge the head: the held-out images "
        f"(--held-out-fraction {config.held_out_fraction}: {len(sets.held_out_images)} of {pairs_file.num_images}) "
        f"have {num_matching} matching and {num_mismatched} mismatched pairs, and on so few not even a perfect "
        f"AUC of 1.0 clears the verdict's chance floor; it needs at least {per_class} matching and {per_class} "
        f"mismatched held-out pairs (with one caption per image and sampled mismatches: at least {num_images} "
        f"images), or a larger --held-out-fraction")


def _write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(partial, path)


def _evaluation_card(evaluation: Evaluation) -> dict[str, Any]:
    return {"num_matching": evaluation.num_matching, "num_mismatched": evaluation.num_mismatched,
            "accuracy": round(evaluation.accuracy, 6), "auc": round(evaluation.auc, 6),
            "loss": round(evaluation.loss, 6)}


def _mismatch_card(sets: _Sets, run: TrainingRun) -> dict[str, Any]:
    described = captions_by_image(sets.train + sets.held_out + (sets.validation or ()))

    def counted(pairs: tuple[ImageTextPair, ...] | None) -> dict[str, int] | None:
        if pairs is None:
            return None
        mismatches = [p for p in pairs if not p.is_match]
        return {"num": len(mismatches), "num_near_duplicate": count_near_duplicates(mismatches, described)}

    return {"near_duplicate": NEAR_DUPLICATE_MEANING,
            "train": {"num": run.num_sampled_mismatches, "num_near_duplicate": run.num_near_duplicate_mismatches},
            "validation": counted(sets.validation), "held_out": counted(sets.held_out)}


def _training_card(config: TrainingConfig, plan: TrainingPlan, run: TrainingRun, feature_s: float,
                   training_s: float) -> dict[str, Any]:
    early_stopping = (f"after each epoch, on the validation AUC; keeps the best epoch's weights; stops after "
                      f"{plan.patience_steps} steps without improvement") if run.curve[-1].validation_auc is not None \
        else "none (too few training images for a validation split): the last epoch's weights are kept"
    return {
        **asdict(config), "epochs": plan.num_epochs, "learning_rate": plan.learning_rate,
        "chosen": {"budget_steps": plan.num_steps, "budget_from": plan.budget_from,
                   "steps_per_epoch": plan.steps_per_epoch, "learning_rate_from": plan.learning_rate_from,
                   "warmup_steps": plan.warmup_steps, "patience_steps": plan.patience_steps,
                   "schedule": f"linear warm-up, then cosine to {FINAL_LR_FRACTION} of the peak",
                   "early_stopping": early_stopping},
        "steps_run": run.num_steps, "epochs_run": len(run.curve), "best_epoch": run.best_epoch,
        "stopped_early": run.is_stopped_early, "final_loss": round(run.final_loss, 6),
        "feature_seconds": round(feature_s, 3), "training_seconds": round(training_s, 3),
    }


def _curve_card(run: TrainingRun) -> list[dict[str, Any]]:
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 6)

    return [{"epoch": r.epoch, "step": r.step, "train_loss": round(r.train_loss, 6),
             "learning_rate": float(f"{r.learning_rate:.6g}"), "validation_auc": rounded(r.validation_auc),
             "validation_loss": rounded(r.validation_loss)} for r in run.curve]


def train_fusion(model: str, pairs: Path | PairsFile, out_dir: Path, config: TrainingConfig = TrainingConfig(), *,
                 device: str = "cpu", feature_batch_size: int = 32, is_untrained_result_kept: bool = False,
                 progress: ProgressFactory = silent_progress) -> TrainedHead:
    """Train a fresh head for ``model`` (a ``--model`` directory or Hub id) on ``pairs``; write it to ``out_dir``.

    ``pairs`` is the JSONL file or its ``read_pairs`` result (the command line
    reads it first, to stop on a bad line before loading torch and the model).
    The card is always written; the head file only when it learned
    (``models.training.verdict``), or marked untrained when
    ``is_untrained_result_kept``. The result's ``verdict`` says which. A
    held-out set on which no AUC could pass (``verdict.is_passable``) raises
    ``TrainingDataError`` before the model is loaded.
    """
    pairs_file = pairs if isinstance(pairs, PairsFile) else read_pairs(pairs)
    sets = _make_sets(pairs_file, config)
    _check_held_out_is_passable(sets, pairs_file, config)  # before the model loads: no head could pass
    bundle = load_pretrained(model, device=device, is_trained_head_read=False)
    if bundle.config.dtype != "float32":
        raise ModelRepositoryError(f"{model}: train-fusion trains on float32 towers; this model is declared "
                                   f"dtype {bundle.config.dtype} (module docstring of models.training.train_fusion)")
    towers_fingerprint = fingerprint(bundle.model, bundle.tokenizer, bundle.config, skip_prefix="fusion.")

    started_s = time.perf_counter()
    features = compute_tower_features(bundle.model, bundle.tokenizer, pairs_file.pairs, pairs_file.path,
                                      batch_size=feature_batch_size, progress=progress)
    feature_s = time.perf_counter() - started_s

    num_train_matching = sum(p.is_match for p in sets.train)
    num_train_mismatched = num_train_matching if sets.sample_texts is not None else len(sets.train) - num_train_matching
    plan = plan_training(num_train_matching + num_train_mismatched, config.batch_size,
                         bundle.model.fusion.v_proj.in_features, epochs=config.epochs,
                         learning_rate=config.learning_rate)
    head = fresh_head(bundle.model.fusion, config.seed).to(device)
    untrained = evaluate(head, features, sets.held_out)
    started_s = time.perf_counter()
    run = train_head(head, features, sets.train, validation_pairs=sets.validation, sample_texts=sets.sample_texts,
                     plan=plan, config=config, progress=progress)
    training_s = time.perf_counter() - started_s
    trained = evaluate(head, features, sets.held_out)
    verdict = judge(trained.auc, untrained.auc, trained.num_matching, trained.num_mismatched)
    validation_aucs = [r.validation_auc for r in run.curve if r.validation_auc is not None]
    to_try = "" if verdict.is_learned else advice(
        num_pairs=len(pairs_file.pairs), num_images=pairs_file.num_images, learning_rate=plan.learning_rate,
        learning_rate_from=plan.learning_rate_from, num_epochs_run=len(run.curve), best_epoch=run.best_epoch,
        best_validation_auc=max(validation_aucs) if validation_aucs else None)

    card = {
        "format": CARD_FORMAT, "format_version": CARD_FORMAT_VERSION,
        "model": model, "model_directory": bundle.source, "family": bundle.config.family, "rank": head.rank,
        "towers_fingerprint": towers_fingerprint,
        "pairs": {"file": str(pairs_file.path.resolve()), "sha256": pairs_file.sha256,
                  "num_pairs": len(pairs_file.pairs),
                  "mismatches": "labelled" if sets.sample_texts is None else "sampled"},
        "split": {"by": "image", "held_out_fraction": config.held_out_fraction,
                  "validation_fraction": config.validation_fraction,
                  "num_train_images": len({p.image for p in sets.train}),
                  "num_validation_images": len(sets.validation_images),
                  "num_held_out_images": len(sets.held_out_images)},
        "train": {"num_matching": num_train_matching, "num_mismatched": num_train_mismatched},
        **({"sampled_mismatches": _mismatch_card(sets, run)} if sets.sample_texts is not None else {}),
        "held_out": _evaluation_card(trained),
        "untrained_held_out": _evaluation_card(untrained),
        "auc_meaning": AUC_MEANING,
        "verdict": {"learned": verdict.is_learned, "rule": verdict.rule, "min_auc": round(verdict.min_auc, 6),
                    "summary": verdict.describe(),
                    **({} if verdict.is_learned else {"advice": to_try,
                                                      "head_file": "kept, marked untrained" if is_untrained_result_kept
                                                      else "not written"})},
        "training": _training_card(config, plan, run, feature_s, training_s),
        "validation_curve": _curve_card(run),
        "trained_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    head_path, card_path = out_dir / FUSION_HEAD_FILE, out_dir / CARD_FILE
    if verdict.is_learned or is_untrained_result_kept:
        partial_head = out_dir / (FUSION_HEAD_FILE + ".partial")
        save_fusion_head(partial_head, head, towers_fingerprint=towers_fingerprint, is_trained=verdict.is_learned,
                         card=card)
        os.replace(partial_head, head_path)
        written: Path | None = head_path
    else:
        head_path.unlink(missing_ok=True)  # an earlier run's head beside this card would be taken for this run's
        written = None
    _write_json_atomically(card_path, card)
    return TrainedHead(head_path=written, card_path=card_path, held_out=trained, untrained_held_out=untrained,
                       verdict=verdict, advice=to_try, card=card)
