"""``mmserve train-fusion``: its flags and the command (read the pairs, train the head, report what it learned).

Kept apart from ``server.cli``, which only dispatches to it; exit 2 on bad input
(``TrainingDataError``, printed by the CLI), 3 when the head learned nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {value}")
    return value


def train_fusion_parser(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser(
        "train-fusion", help="train the fusion head of a model on image-text pairs",
        description="Train only the low-rank fusion head of --model (its towers stay frozen, their outputs are "
                    "computed once) on the image-text pairs of a JSONL file: one "
                    '{"image": "path relative to the file", "text": "...", "label": 0|1 (optional, default 1)} '
                    "a line; without label-0 lines mismatched pairs are sampled. A fifth of the images is held out; "
                    "15% of the rest is the validation set that chooses the epoch and stops training early. "
                    "The step budget and the learning rate are chosen from the data and the head's width unless "
                    "--epochs / --lr say. Writes DIR/fusion_head.safetensors and DIR/fusion_head_card.json "
                    "(held-out accuracy and AUC, the validation curve, what was chosen). "
                    "Exits 2 on bad input, naming the line, and before training when the held-out images bring too few "
                    "pairs for any AUC to pass the rule (fewer than 7 matching and 7 mismatched: with one caption "
                    "per image and the default --held-out-fraction, fewer than 31 images); exits 3 when the head learned nothing (held-out AUC "
                    "below 0.6, or within chance for the held-out count, or less than 0.05 above the untrained "
                    "head's): the card is written, the head is not.",
    )
    train.add_argument("--model", required=True, metavar="DIR_OR_HUB_ID",
                       help="the model to train a head for, as `mmserve serve --model` takes it")
    train.add_argument("--pairs", required=True, type=Path, metavar="FILE.jsonl", help="image-text pairs")
    train.add_argument("--out", required=True, type=Path, metavar="DIR", help="where the head and its card go")
    train.add_argument("--epochs", type=positive_int, metavar="N",
                       help="train at most N epochs (default: a budget of steps chosen from the data, 20 epochs "
                            "within 300 to 2000 steps; early stopping on the validation AUC applies either way)")
    train.add_argument("--lr", type=_positive_float, metavar="LR",
                       help="peak AdamW learning rate after warm-up (default 0.01 / sqrt(image token width), "
                            "e.g. 0.000625 at 256, 0.00036 at 768)")
    train.add_argument("--batch-size", type=positive_int, default=64, help="pairs per step (default 64)")
    train.add_argument("--held-out-fraction", type=_fraction, default=0.2,
                       help="share of images held out for accuracy and AUC (default 0.2)")
    train.add_argument("--validation-fraction", type=_fraction, default=0.15,
                       help="share of the other images that chooses the epoch and stops training early (default 0.15)")
    train.add_argument("--seed", type=int, default=0, help="the head's initial weights, split and sampling (default 0)")
    train.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                       help="where the towers and the head run (default auto)")
    train.add_argument("--keep-untrained-result", action="store_true",
                       help="when the head learned nothing, still write fusion_head.safetensors, marked untrained "
                            "(the server then serves no match_score from it); the exit code stays 3")


def run_train_fusion(args: argparse.Namespace) -> int:
    from models.training.pairs import read_pairs

    pairs = read_pairs(args.pairs)  # a bad line stops here, before torch and the model are loaded

    from tqdm import tqdm

    from models.training.loop import TrainingConfig
    from models.training.train_fusion import train_fusion
    from server.runtime.model_loading import resolve_device

    def progress(description: str, total: int) -> tqdm:
        return tqdm(total=total, desc=description, file=sys.stderr, dynamic_ncols=True)

    config = TrainingConfig(epochs=args.epochs, learning_rate=args.lr, batch_size=args.batch_size,
                            held_out_fraction=args.held_out_fraction,
                            validation_fraction=args.validation_fraction, seed=args.seed)
    result = train_fusion(args.model, pairs, args.out, config, device=resolve_device(args.device),
                          is_untrained_result_kept=args.keep_untrained_result, progress=progress)
    held_out, untrained, training = result.held_out, result.untrained_held_out, result.card["training"]
    print(f"held-out AUC {held_out.auc:.3f} (the untrained head: {untrained.auc:.3f}), "
          f"accuracy {held_out.accuracy:.3f} on {held_out.num_matching} matching and {held_out.num_mismatched} mismatched pairs of unseen images")
    print(f"trained {training['steps_run']} steps ({training['epochs_run']} epochs) at a peak learning rate of "
          f"{training['learning_rate']:.3g}; kept epoch {training['best_epoch']}"
          + (", stopped early" if training["stopped_early"] else ""))
    if not result.verdict.is_learned:
        kept = (f"wrote {result.head_path}, marked untrained (served without match_score), and {result.card_path}"
                if result.head_path is not None else f"wrote {result.card_path} but no head")
        print(f"mmserve: the head learned nothing: {result.verdict.describe()}; {kept}. {result.advice}",
              file=sys.stderr)
        return 3
    print(f"wrote {result.head_path} and {result.card_path}")
    print(f"serve it with: mmserve serve --model {args.model} --fusion-head {result.head_path} "
          f"(or copy {result.head_path.name} beside the model)")
    return 0
