"""``mmserve train-fusion`` refuses, before training, a pairs file whose held-out set no head could pass on.

10 pairs of 10 images (the least ``read_pairs`` takes) hold out 2 images:
2 matching and 2 sampled mismatched pairs, where the verdict's chance floor
(``models.training.verdict``) is 1.50, above any AUC. The command used to
train, then exit 3 printing "at least 1.501"; it must exit 2 at once, in one
line that says how many held-out pairs it needs, and write nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.random_pretrained import write_siglip
from tests.shape_pairs import write_shape_pairs


def _train_fusion(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # see tests/integration/test_train_fusion.py
    return subprocess.run([sys.executable, "-m", "server.cli", "train-fusion", *args, "--device", "cpu"],
                          capture_output=True, text=True, timeout=300, env=env)


def test_a_held_out_set_too_small_for_any_auc_to_pass_exits_2_in_one_line_before_training(tmp_path: Path):
    pairs_path, _ = write_shape_pairs(tmp_path / "shapes", num_images=10)
    model_dir = write_siglip(tmp_path / "tiny-siglip")
    done = _train_fusion("--model", str(model_dir), "--pairs", str(pairs_path), "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr  # no bar: nothing was computed
    assert "2 matching and 2 mismatched pairs" in done.stderr, done.stderr
    assert "at least 7 matching and 7 mismatched held-out pairs" in done.stderr, done.stderr
    assert "at least 31 images" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()
