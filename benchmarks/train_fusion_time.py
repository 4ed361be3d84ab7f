"""How long ``mmserve train-fusion`` takes with its defaults, on two CPU cores, at the ViT-B/16 shape.

    python -m benchmarks.train_fusion_time                       # 120, 1,000 and 5,000 pairs, ViT-B/16 shape
    python -m benchmarks.train_fusion_time --pairs 40 --tiny --cores 1 --epochs 2    # a smoke run, seconds

The towers are a random CLIP of the ViT-B/16 shape (``CLIPModel``: 12
layers, 768 wide, 224 px, 16 px patches, 197 image tokens; the text tower
as wide and as deep, 512-wide embeddings), written by
``benchmarks.random_pretrained``; the pairs are ``benchmarks.coloured_shapes``
(one caption per 224 px JPEG). Each size runs the command as a user would,
in its own process pinned to two cores (``os.sched_setaffinity`` where the
OS has it, and two torch threads), with no flag but the required ones, so
the budget, learning rate and early stopping are the defaults'.

The table gives, per size: the wall time of the whole command, the time
spent computing tower features and training the head (both from the model
card), the steps run against the budget, seconds per step, and the held-out
AUC (random towers: it shows that the run learned, not what a real model
reaches). Nothing here is collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.coloured_shapes import write_coloured_shapes
from benchmarks.random_pretrained import TowerSize, write_clip

VIT_B16 = TowerSize(image_size=224, patch_size=16, hidden_size=768, num_layers=12, num_heads=12,
                    intermediate_size=3072, projection_dim=512)
TINY = TowerSize(image_size=64, patch_size=16, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128,
                 projection_dim=48)
DEFAULT_SIZES = (120, 1000, 5000)
NUM_CORES = 2


@dataclass(frozen=True)
class TimedRun:
    num_pairs: int
    wall_s: float
    feature_s: float
    training_s: float
    steps_run: int
    budget_steps: int
    epochs_run: int
    held_out_auc: float
    is_learned: bool

    @property
    def seconds_per_step(self) -> float:
        return self.training_s / self.steps_run if self.steps_run else float("nan")


def timed_run_of(card: dict[str, Any], wall_s: float) -> TimedRun:
    """The row of one run, read from its model card (``models.training.train_fusion``) and its wall time."""
    training = card["training"]
    return TimedRun(num_pairs=card["pairs"]["num_pairs"], wall_s=wall_s, feature_s=training["feature_seconds"],
                    training_s=training["training_seconds"], steps_run=training["steps_run"],
                    budget_steps=training["chosen"]["budget_steps"], epochs_run=training["epochs_run"],
                    held_out_auc=card["held_out"]["auc"], is_learned=card["verdict"]["learned"])


def format_table(runs: list[TimedRun], header: str) -> str:
    lines = [header, f"{'pairs':>6} {'wall s':>8} {'features s':>10} {'training s':>10} {'steps/budget':>13} "
                     f"{'epochs':>6} {'s/step':>7} {'held-out AUC':>12}"]
    for run in runs:
        auc = f"{run.held_out_auc:.3f}" + ("" if run.is_learned else " (exit 3)")
        lines.append(f"{run.num_pairs:>6} {run.wall_s:>8.1f} {run.feature_s:>10.1f} {run.training_s:>10.1f} "
                     f"{f'{run.steps_run}/{run.budget_steps}':>13} {run.epochs_run:>6} {run.seconds_per_step:>7.3f} "
                     f"{auc:>12}")
    return "\n".join(lines)


def _pinned_to_cores(num_cores: int) -> Any:
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))[:num_cores]
    return lambda: os.sched_setaffinity(0, cores)


def run_one(model_dir: Path, pairs_path: Path, out_dir: Path, num_cores: int = NUM_CORES,
            epochs: int | None = None) -> TimedRun:
    env = {**os.environ, "OMP_NUM_THREADS": str(num_cores), "MKL_NUM_THREADS": str(num_cores)}
    extra = [] if epochs is None else ["--epochs", str(epochs)]
    started_s = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "server.cli", "train-fusion", "--model", str(model_dir),
                           "--pairs", str(pairs_path), "--out", str(out_dir), "--device", "cpu", *extra],
                          capture_output=True, text=True, env=env, preexec_fn=_pinned_to_cores(num_cores))
    wall_s = time.perf_counter() - started_s
    if done.returncode not in (0, 3):
        raise RuntimeError(f"train-fusion exited {done.returncode}: {done.stderr[-2000:]}")
    return timed_run_of(json.loads((out_dir / "fusion_head_card.json").read_text()), wall_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=list(DEFAULT_SIZES), help="data set sizes")
    parser.add_argument("--tiny", action="store_true", help="small towers: a smoke run of the script")
    parser.add_argument("--cores", type=int, default=NUM_CORES, help=f"CPU cores and torch threads (default {NUM_CORES})")
    parser.add_argument("--epochs", type=int, help="pass --epochs to train-fusion (smoke runs; default: none)")
    args = parser.parse_args(argv)
    size = TINY if args.tiny else VIT_B16
    with tempfile.TemporaryDirectory(prefix="train-fusion-time-") as tmp:
        root = Path(tmp)
        model_dir = write_clip(root / "clip", size)
        runs = []
        for num_pairs in args.pairs:
            pairs_path, _ = write_coloured_shapes(root / f"pairs-{num_pairs}", num_images=num_pairs)
            runs.append(run_one(model_dir, pairs_path, root / f"head-{num_pairs}", args.cores, args.epochs))
            print(f"done: {num_pairs} pairs", file=sys.stderr, flush=True)
    shape = "tiny towers (smoke)" if args.tiny else "ViT-B/16 shape"
    budget = "defaults" if args.epochs is None else f"--epochs {args.epochs}"
    print(format_table(runs, f"train-fusion {budget}, random CLIP, {shape}, {args.cores} CPU cores, "
                             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
