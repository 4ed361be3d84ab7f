"""``mmserve train-fusion`` teaches the head to tell matching pairs from mismatched ones, and serving says so.

A random SigLIP (``benchmarks.random_pretrained``) has frozen towers that
know nothing; the dataset is generated (``tests.shape_pairs``: circles,
squares and triangles in three colours, captioned). The head learns from the
towers' token outputs alone, and is judged on images it never saw. Then the
trained head is served, from ``--fusion-head`` and from beside the model,
and the answers carry a ``match_score`` that ranks a held-out image's own
caption above the others.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.random_pretrained import write_siglip
from models.fusion_head_file import FUSION_HEAD_FILE
from models.training.pairs import read_pairs, split_by_image
from models.families.pretrained import load_pretrained
from models.training.train_fusion import CARD_FILE
from server.settings import Settings
from tests.shape_pairs import COLOURS, SHAPES, write_shape_pairs

NUM_IMAGES = 450  # 50 of each colour and shape; 90 held out
EPOCHS = 40


def _train_fusion(*args: str) -> subprocess.CompletedProcess:
    # One intra-op thread: the head's ops are small, and on a machine whose cores are busy a second thread
    # spinning for its share makes a step 10x slower rather than 2x faster.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "server.cli", "train-fusion", *args],
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, Path, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("train-fusion")
    pairs_path, _ = write_shape_pairs(root / "shapes", num_images=NUM_IMAGES)
    model_dir = write_siglip(root / "tiny-siglip")
    done = _train_fusion("--model", str(model_dir), "--pairs", str(pairs_path), "--out", str(root / "head"),
                         "--epochs", str(EPOCHS), "--device", "cpu")
    assert done.returncode == 0, done.stdout + done.stderr
    return model_dir, pairs_path, root / "head", done


def test_the_trained_head_separates_held_out_pairs_far_better_than_the_untrained_one(trained):
    model_dir, pairs_path, out_dir, done = trained
    card = json.loads((out_dir / CARD_FILE).read_text())
    trained_auc, untrained_auc = card["held_out"]["auc"], card["untrained_held_out"]["auc"]
    figures = (f"held-out AUC trained {trained_auc:.3f}, untrained {untrained_auc:.3f}; "
               f"accuracy trained {card['held_out']['accuracy']:.3f}, "
               f"untrained {card['untrained_held_out']['accuracy']:.3f}")
    assert trained_auc >= 0.9 and untrained_auc < 0.7, figures
    assert trained_auc - untrained_auc >= 0.25, figures
    assert card["held_out"]["accuracy"] >= 0.8, figures
    # The card says what it was trained on, and the numbers the command printed are the card's.
    assert card["pairs"]["sha256"] == read_pairs(pairs_path).sha256 and card["pairs"]["num_pairs"] == NUM_IMAGES
    assert card["pairs"]["mismatches"] == "sampled"
    split = card["split"]  # 90 held out; of the other 360, 15 % (54) choose the epoch and the head learns from 306
    assert (split["num_train_images"], split["num_validation_images"], split["num_held_out_images"]) == (306, 54, 90)
    assert (card["held_out"]["num_matching"], card["held_out"]["num_mismatched"]) == (90, 90)
    assert card["training"]["epochs"] == EPOCHS and card["training"]["chosen"]["budget_from"] == "--epochs"
    assert card["model"] == str(model_dir) and card["verdict"]["learned"]
    assert 1 <= card["training"]["best_epoch"] <= card["training"]["epochs_run"] == len(card["validation_curve"])
    assert f"held-out AUC {trained_auc:.3f} (the untrained head: {untrained_auc:.3f})" in done.stdout
    assert "training the head" in done.stderr and "100%" in done.stderr  # tqdm's bar, on stderr
    # The head file carries the same card, says it is trained, and fits the towers it was trained on.
    bundle = load_pretrained(str(model_dir), fusion_head=out_dir / FUSION_HEAD_FILE)
    assert bundle.fusion_head.is_trained and bundle.fusion_head.card == card
    assert bundle.describe().fusion_head == "trained"


def _held_out_images(pairs_path: Path) -> list[tuple[Path, str]]:
    split = split_by_image(read_pairs(pairs_path).pairs, 0.2, 0)  # the command's split (its default seed)
    return [(pair.image, pair.text) for pair in split.held_out]


def _infer(client, image: Path, text: str) -> dict:
    encoded = base64.b64encode(image.read_bytes()).decode()
    response = client.post("/v1/infer", json={"text": text, "image": {"b64": encoded}})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("where", ["--fusion-head", "beside the model"])
def test_a_served_trained_head_answers_with_a_match_score_that_ranks_the_own_caption_above_others(
        trained, tmp_path: Path, live_server_runner, where):
    model_dir, pairs_path, out_dir, _ = trained
    if where == "--fusion-head":
        settings = Settings(model=str(model_dir), fusion_head=out_dir / FUSION_HEAD_FILE, device="cpu")
    else:
        served_dir = tmp_path / "tiny-siglip"
        shutil.copytree(model_dir, served_dir)
        shutil.copy(out_dir / FUSION_HEAD_FILE, served_dir / FUSION_HEAD_FILE)
        settings = Settings(model=str(served_dir), device="cpu")
    captions = [f"a {colour} {shape}" for colour in COLOURS for shape in SHAPES]
    held_out = _held_out_images(pairs_path)[:12]
    with live_server_runner(settings) as server, server.client() as client:
        listed = client.get("/v1/models").json()["data"][0]["mmserve"]
        assert listed["fusion_head"] == "trained", listed
        num_above, num_compared, lines = 0, 0, []
        for image, caption in held_out:
            answers = {text: _infer(client, image, text) for text in captions}
            assert all(a["model"]["fusion_head"] == "trained" and 0.0 <= a["match_score"] <= 1.0
                       for a in answers.values()), answers[caption]
            own = answers[caption]["match_score"]
            others = [a["match_score"] for text, a in answers.items() if text != caption]
            num_above += sum(own > other for other in others)
            num_compared += len(others)
            lines.append(f"{image.name} {caption!r}: {own:.3f}; the 8 other captions "
                         + " ".join(f"{other:.3f}" for other in others))
    # Each unseen image's own caption against each of the 8 that do not describe it: the served AUC.
    served_auc = num_above / num_compared
    assert served_auc >= 0.85, f"served AUC over held-out images {served_auc:.3f}\n" + "\n".join(lines)


def test_bad_pairs_exit_2_naming_the_line_without_a_traceback(trained, tmp_path: Path):
    model_dir, pairs_path, _, _ = trained
    lines = pairs_path.read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    image = str((pairs_path.parent / json.loads(lines[0])["image"]).resolve())
    bad.write_text("\n".join([json.dumps({"image": image, "text": "a red circle"}),
                              json.dumps({"image": image, "text": "a red circle", "label": 2})]) + "\n")
    done = _train_fusion("--model", str(model_dir), "--pairs", str(bad), "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{bad}:2: \"label\" must be 0 or 1, got 2" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()
