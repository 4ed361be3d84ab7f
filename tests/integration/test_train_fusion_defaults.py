"""``mmserve train-fusion`` with its defaults learns from 120 images, and refuses a head that learned nothing.

The towers are a random CLIP (transformers ``CLIPModel``, 4 layers, 256 wide,
224 px input, 32 px patches) built with its constructors and
``save_pretrained``; the data are ``tests/coloured_shapes.py``: 224 px JPEG
photos of a rotated disc, star or square in one of four colours on a
speckled gradient, one caption each ("a yellow star"), unlike
``tests.shape_pairs``'s 64 px flat PNGs. No flag but the required ones:
the step budget, learning rate, warm-up and early stopping are the
trainer's own choices.

The same images with their captions shuffled at random carry no signal: the
command must exit 3, write the card and no head, and say what it measured
and what to try. With ``--keep-untrained-result`` it writes the head marked
untrained, and a live server then answers without ``match_score``.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from coloured_shapes import write_coloured_shapes, shuffled_captions
from benchmarks.random_pretrained import TowerSize, write_clip
from models.fusion_head_file import FUSION_HEAD_FILE
from models.training.train_fusion import CARD_FILE
from server.settings import Settings

pytestmark = pytest.mark.long  # minutes together: started first (tests/conftest.py)

NUM_IMAGES = 120  # 10 of each of the 12 captions; 24 held out, 15 for validation, 81 to learn from
NUM_SHUFFLED = 300
CLIP_SIZE = TowerSize(image_size=224, patch_size=32, hidden_size=256, num_layers=4, num_heads=4,
                      intermediate_size=1024, projection_dim=256)


def _train_fusion(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # see tests/integration/test_train_fusion.py
    return subprocess.run([sys.executable, "-m", "server.cli", "train-fusion", *args, "--device", "cpu"],
                          capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("train-fusion-defaults")
    pairs, _ = write_coloured_shapes(root / "shapes", num_images=NUM_IMAGES)
    noise_pairs, _ = write_coloured_shapes(root / "noise", num_images=NUM_SHUFFLED, seed=1)
    return {"root": root, "pairs": pairs, "shuffled": shuffled_captions(noise_pairs, root / "shuffled.jsonl"),
            "clip": write_clip(root / "clip", CLIP_SIZE)}


def _card(out_dir: Path) -> dict:
    return json.loads((out_dir / CARD_FILE).read_text())


def test_the_defaults_learn_120_coloured_shapes_on_a_random_clip(data):
    out_dir = data["root"] / "head"
    done = _train_fusion("--model", str(data["clip"]), "--pairs", str(data["pairs"]), "--out", str(out_dir))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    card = _card(out_dir)
    figures = f"held-out {card['held_out']}, untrained {card['untrained_held_out']}, training {card['training']}"
    assert card["held_out"]["auc"] >= 0.85, figures
    assert card["untrained_held_out"]["auc"] < 0.7 and card["verdict"]["learned"], figures
    split = card["split"]
    assert (split["num_train_images"], split["num_validation_images"], split["num_held_out_images"]) == (81, 15, 24)
    # What the trainer chose, from the data and the head's width (0.01 / sqrt(256)), is on the card.
    chosen, training = card["training"]["chosen"], card["training"]
    assert (chosen["budget_from"], chosen["learning_rate_from"]) == ("data", "head width"), chosen
    assert training["learning_rate"] == pytest.approx(0.01 / 16) and chosen["budget_steps"] == 300
    curve = card["validation_curve"]
    assert len(curve) == training["epochs_run"] and training["steps_run"] == curve[-1]["step"] <= 300
    best = max(curve, key=lambda r: (r["validation_auc"], -r["validation_loss"]))
    assert best["epoch"] == training["best_epoch"], (best, training)
    assert curve[0]["validation_auc"] < best["validation_auc"]  # the curve rose: the kept epoch is not the first
    # Sampled mismatches: one per held-out image; about 5 in 11 of the other captions share a colour or a shape
    # ("a red disc" for "a red star": Jaccard 2/4), and the card counts them.
    mismatches = card["sampled_mismatches"]
    assert mismatches["held_out"]["num"] == 24 and 0 < mismatches["held_out"]["num_near_duplicate"] < 24
    assert 0.3 < mismatches["train"]["num_near_duplicate"] / mismatches["train"]["num"] < 0.6, mismatches
    assert "0.5 is chance" in card["auc_meaning"]
    assert f"held-out AUC {card['held_out']['auc']:.3f}" in done.stdout and (out_dir / FUSION_HEAD_FILE).is_file()


def test_shuffled_captions_exit_3_with_the_card_and_no_head(data):
    out_dir = data["root"] / "shuffled-head"
    done = _train_fusion("--model", str(data["clip"]), "--pairs", str(data["shuffled"]), "--out", str(out_dir))
    assert done.returncode == 3, done.stdout + done.stderr[-3000:]
    card = _card(out_dir)
    assert not (out_dir / FUSION_HEAD_FILE).exists() and not card["verdict"]["learned"]
    assert card["verdict"]["head_file"] == "not written" and card["pairs"]["num_pairs"] == NUM_SHUFFLED
    message = done.stderr.splitlines()[-1]
    assert message.startswith("mmserve: the head learned nothing: held-out AUC "), message
    assert f"{card['held_out']['auc']:.3f} against {card['untrained_held_out']['auc']:.3f}" in message
    assert all(hint in message for hint in ("more pairs", "--lr", "--epochs", "--keep-untrained-result")), message
    assert "Traceback" not in done.stderr


def _infer(client, image: Path, text: str) -> dict:
    response = client.post("/v1/infer", json={"text": text, "image": {"b64": base64.b64encode(image.read_bytes()).decode()}})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_kept_untrained_result_is_served_without_match_score(data, live_server_runner):
    out_dir = data["root"] / "kept-head"
    done = _train_fusion("--model", str(data["clip"]), "--pairs", str(data["shuffled"]), "--out", str(out_dir),
                         "--epochs", "2", "--keep-untrained-result")
    assert done.returncode == 3, done.stdout + done.stderr[-3000:]
    head = out_dir / FUSION_HEAD_FILE
    with safe_open(str(head), framework="pt") as f:
        assert f.metadata()["trained"] == "false"
    assert _card(out_dir)["verdict"]["head_file"] == "kept, marked untrained"
    image = next((data["root"] / "noise" / "photos").glob("*.jpg"))
    with live_server_runner(Settings(model=str(data["clip"]), fusion_head=head, device="cpu")) as server, \
            server.client() as client:
        assert client.get("/v1/models").json()["data"][0]["mmserve"]["fusion_head"] == "untrained"
        answer = _infer(client, image, "a red disc")
    assert answer["model"]["fusion_head"] == "untrained" and "match_score" not in answer, answer
    assert answer["route"] == "fusion" and len(answer["image_embedding"]) == CLIP_SIZE.projection_dim
