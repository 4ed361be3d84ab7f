"""``mmserve train-fusion``: train the fusion head of a model on image–text pairs, write it and its card.

    DIR/
    ├── fusion_head.safetensors   the head (models.fusion_head_file): trained = "true", the towers
    │                             fingerprint, and the card below as its ``card`` metadata
    └── fusion_head_card.json     the model card, for people:

    {"format": "mmserve-fusion-head-card", "format_version": "1",
     "model": "google/siglip-base-patch16-224",    as given to --model
     "model_directory": "/abs/dir", "family": "siglip", "rank": 16,
     "towers_fingerprint": "<64 hex>",            the towers it was trained on (the server checks it)
     "pairs": {"file": "/abs/pairs.jsonl", "sha256": "<64 hex>", "num_pairs": 3000,
               "mismatches": "sampled" | "labelled"},
     "split": {"by": "image", "held_out_fraction": 0.2, "num_train_images": 800, "num_held_out_images": 200},
     "train": {"num_matching": 2400, "num_mismatched": 2400},    per epoch (sampled afresh each epoch)
     "held_out": {"num_matching": 600, "num_mismatched": 600, "accuracy": 0.93, "auc": 0.98},
     "untrained_held_out": {"accuracy": 0.5, "auc": 0.51},       the same pairs, the head before training
     "training": {"epochs": 30, "learning_rate": 0.003, "weight_decay": 0.01, "batch_size": 64, "seed": 0,
                  "final_loss": 0.12, "feature_seconds": 41.0, "training_seconds": 95.2},
     "trained_at": "2025-01-01T12:00:00+00:00"}

Serve the result by copying ``fusion_head.safetensors`` beside the model or
with ``mmserve serve --model M --fusion-head DIR/fusion_head.safetensors``.

The towers are loaded as serving loads them and stay frozen; their outputs
are computed once (``models.training.features``), and only the head learns
(``models.training.loop``). The towers must be float32 as loaded, which
every pretrained family is: the head file names the towers by the
fingerprint of their tensors as read, and a float16 / bfloat16 repository's
served tensors are not those.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from models.errors import ModelRepositoryError, TrainingDataError
from models.training.features import compute_tower_features
from models.fusion_head_file import FUSION_HEAD_FILE, save_fusion_head
from models.training.pairs import ImageTextPair, PairsFile, PairSplit, read_pairs, sample_mismatches, split_by_image
from models.training.loop import Evaluation, TrainingConfig, evaluate, fresh_head, train_head
from models.families.pretrained import load_pretrained
from models.training.progress import ProgressFactory, silent_progress
from models.loading.repository import fingerprint

CARD_FILE = "fusion_head_card.json"
CARD_FORMAT = "mmserve-fusion-head-card"
CARD_FORMAT_VERSION = "1"


@dataclass(frozen=True)
class TrainedHead:
    """What ``train_fusion`` wrote and how the head did on the held-out pairs."""

    head_path: Path
    card_path: Path
    held_out: Evaluation
    untrained_held_out: Evaluation
    card: dict[str, Any]


def _check_both_classes(split: PairSplit, pairs_path: Path) -> None:
    for name, pairs in (("training", split.train), ("held-out", split.held_out)):
        if not any(p.is_match for p in pairs) or all(p.is_match for p in pairs):
            raise TrainingDataError(f"{pairs_path}: the {name} images (split by image) do not have both matching "
                                    "and label-0 pairs; add label-0 lines for more images, or leave every label "
                                    "out to have mismatches sampled")


def _write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(partial, path)


def _evaluation_card(evaluation: Evaluation) -> dict[str, Any]:
    return {"num_matching": evaluation.num_matching, "num_mismatched": evaluation.num_mismatched,
            "accuracy": round(evaluation.accuracy, 6), "auc": round(evaluation.auc, 6)}


def train_fusion(model: str, pairs: Path | PairsFile, out_dir: Path, config: TrainingConfig = TrainingConfig(), *,
                 device: str = "cpu", feature_batch_size: int = 32,
                 progress: ProgressFactory = silent_progress) -> TrainedHead:
    """Train a fresh head for ``model`` (a ``--model`` directory or Hub id) on ``pairs``; write it to ``out_dir``.

    ``pairs`` is the JSONL file or its ``read_pairs`` result (the command line
    reads it first, to stop on a bad line before loading torch and the model).
    """
    pairs_file = pairs if isinstance(pairs, PairsFile) else read_pairs(pairs)
    bundle = load_pretrained(model, device=device, is_trained_head_read=False)
    if bundle.config.dtype != "float32":
        raise ModelRepositoryError(f"{model}: train-fusion trains on float32 towers; this model is declared "
                                   f"dtype {bundle.config.dtype} (module docstring of models.training.train_fusion)")
    towers_fingerprint = fingerprint(bundle.model, bundle.tokenizer, bundle.config, skip_prefix="fusion.")

    split = split_by_image(pairs_file.pairs, config.held_out_fraction, config.seed)
    sample_texts: list[str] | None = None
    held_out: tuple[ImageTextPair, ...] = split.held_out
    if not pairs_file.has_mismatches:
        sample_texts = sorted({p.text for p in pairs_file.pairs})
        held_out = held_out + sample_mismatches(held_out, sample_texts, random.Random(f"{config.seed}:held-out"))
    else:
        _check_both_classes(split, pairs_file.path)

    started_s = time.perf_counter()
    features = compute_tower_features(bundle.model, bundle.tokenizer, pairs_file.pairs, pairs_file.path,
                                      batch_size=feature_batch_size, progress=progress)
    feature_s = time.perf_counter() - started_s

    head = fresh_head(bundle.model.fusion, config.seed).to(device)
    untrained = evaluate(head, features, held_out)
    started_s = time.perf_counter()
    final_loss = train_head(head, features, split.train, sample_texts=sample_texts, config=config, progress=progress)
    training_s = time.perf_counter() - started_s
    trained = evaluate(head, features, held_out)

    num_train_matching = sum(p.is_match for p in split.train)
    card = {
        "format": CARD_FORMAT, "format_version": CARD_FORMAT_VERSION,
        "model": model, "model_directory": bundle.source, "family": bundle.config.family, "rank": head.rank,
        "towers_fingerprint": towers_fingerprint,
        "pairs": {"file": str(pairs_file.path.resolve()), "sha256": pairs_file.sha256,
                  "num_pairs": len(pairs_file.pairs), "mismatches": "labelled" if sample_texts is None else "sampled"},
        "split": {"by": "image", "held_out_fraction": config.held_out_fraction,
                  "num_train_images": len({p.image for p in split.train}),
                  "num_held_out_images": len({p.image for p in split.held_out})},
        "train": {"num_matching": num_train_matching,
                  "num_mismatched": (num_train_matching if sample_texts is not None
                                     else len(split.train) - num_train_matching)},
        "held_out": _evaluation_card(trained),
        "untrained_held_out": _evaluation_card(untrained),
        "training": {**asdict(config), "final_loss": round(final_loss, 6), "feature_seconds": round(feature_s, 3),
                     "training_seconds": round(training_s, 3)},
        "trained_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    head_path, card_path = out_dir / FUSION_HEAD_FILE, out_dir / CARD_FILE
    partial_head = out_dir / (FUSION_HEAD_FILE + ".partial")
    save_fusion_head(partial_head, head, towers_fingerprint=towers_fingerprint, is_trained=True, card=card)
    os.replace(partial_head, head_path)
    _write_json_atomically(card_path, card)
    return TrainedHead(head_path=head_path, card_path=card_path, held_out=trained, untrained_held_out=untrained,
                       card=card)
