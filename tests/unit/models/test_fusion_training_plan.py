"""What the trainer chooses and judges: the step budget, the learning-rate schedule, the kept epoch, the verdict."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from models.training.features import TowerFeatures
from models.training.loop import fresh_head
from models.fusion import LowRankCrossAttention
from models.training.plan import FINAL_LR_FRACTION, plan_training
from models.training.verdict import advice, chance_sigma, judge, min_held_out_auc


@pytest.mark.parametrize(("num_examples", "steps_per_epoch", "num_steps", "num_epochs"), [
    (160, 3, 300, 100),  # 20 epochs would be 60 steps: the floor of 300 steps
    (1600, 25, 500, 20),  # 20 epochs
    (8000, 125, 2000, 16),  # 20 epochs would be 2,500 steps: the ceiling
    (65, 2, 300, 150),
])
def test_the_budget_is_twenty_epochs_of_steps_within_300_to_2000(num_examples, steps_per_epoch, num_steps,
                                                                  num_epochs):
    plan = plan_training(num_examples, 64, 256)
    assert (plan.steps_per_epoch, plan.num_steps, plan.num_epochs) == (steps_per_epoch, num_steps, num_epochs)
    assert plan.budget_from == "data" and plan.patience_steps == max(100, round(num_steps / 4))


def test_epochs_and_lr_override_the_choice():
    plan = plan_training(1600, 64, 768, epochs=3, learning_rate=0.01)
    assert (plan.num_steps, plan.num_epochs, plan.budget_from) == (75, 3, "--epochs")
    assert (plan.learning_rate, plan.learning_rate_from) == (0.01, "--lr")
    default = plan_training(1600, 64, 768)
    assert default.learning_rate == pytest.approx(0.01 / math.sqrt(768)) and default.learning_rate_from == "head width"


def test_the_rate_warms_up_linearly_then_falls_by_a_cosine_to_a_tenth():
    plan = plan_training(1600, 64, 256)  # 500 steps, 25 of warm-up, peak 0.000625
    peak = plan.learning_rate
    assert plan.warmup_steps == 25
    assert [plan.learning_rate_at(s) for s in (0, 12, 24)] == pytest.approx([peak / 25, peak * 13 / 25, peak])
    middle = 25 + (500 - 25) // 2
    assert plan.learning_rate_at(middle) == pytest.approx(peak * (FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) / 2),
                                                          rel=1e-2)
    assert plan.learning_rate_at(500) == pytest.approx(peak * FINAL_LR_FRACTION)
    rates = [plan.learning_rate_at(s) for s in range(25, 500)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))


def test_the_chance_floor_follows_the_mann_whitney_null_and_is_never_below_0_6():
    # sigma^2 = (m + n + 1) / (12 m n): 24 + 24 -> 49 / 6912
    assert chance_sigma(24, 24) == pytest.approx(math.sqrt(49 / 6912))
    assert min_held_out_auc(24, 24) == pytest.approx(0.5 + 3.1 * math.sqrt(49 / 6912))
    assert min_held_out_auc(1000, 1000) == 0.6
    # the null AUC of random scores stays under the floor (sampled: 2,000 draws of 24 + 24)
    from models.training.loop import roc_auc

    generator = torch.Generator().manual_seed(0)
    labels = torch.tensor([1.0] * 24 + [0.0] * 24)
    aucs = torch.tensor([roc_auc(torch.rand(48, generator=generator), labels) for _ in range(2000)])
    assert float(aucs.std()) == pytest.approx(chance_sigma(24, 24), rel=0.1)
    assert int((aucs >= min_held_out_auc(24, 24)).sum()) <= 8  # ~0.1 %: 2 expected


@pytest.mark.parametrize(("auc", "untrained", "is_learned"), [
    (0.95, 0.50, True),
    (0.70, 0.50, True),  # 90 + 90 held out: the floor is 0.634
    (0.62, 0.50, False),  # under the chance floor
    (0.70, 0.68, False),  # no better than where it started
    (0.59, 0.30, False),  # below 0.6
])
def test_the_verdict(auc, untrained, is_learned):
    verdict = judge(auc, untrained, 90, 90)
    assert verdict.is_learned is is_learned
    assert f"held-out AUC {auc:.3f} against {untrained:.3f}" in verdict.describe()
    assert ("does not meet" in verdict.describe()) is not is_learned


def test_the_advice_names_what_was_run_and_what_to_try():
    text = advice(num_pairs=300, num_images=300, learning_rate=0.000625, learning_rate_from="head width",
                  num_epochs_run=23, best_epoch=8, best_validation_auc=0.486)
    assert "23 epochs" in text and "0.000625" in text and "300 pairs of 300 images" in text and "0.486" in text
    assert all(hint in text for hint in ("more pairs", "--lr", "--epochs", "--keep-untrained-result"))


def _learnable(num_images: int = 24, num_classes: int = 3, width: int = 8):
    """Images and texts of ``num_classes`` classes whose tokens carry the class (plus noise)."""
    from pathlib import Path

    from models.training.pairs import ImageTextPair

    generator = torch.Generator().manual_seed(5)
    prototypes = torch.randn(num_classes, width, generator=generator)
    image_class = [i % num_classes for i in range(num_images)]
    image_tokens = prototypes[image_class][:, None, :] + 0.8 * torch.randn(num_images, 5, width, generator=generator)
    text_tokens = prototypes.repeat_interleave(2, dim=0) + 0.1 * torch.randn(2 * num_classes, width,
                                                                           generator=generator)
    features = TowerFeatures(
        image_rows={Path(f"{i}.png"): i for i in range(num_images)}, image_tokens=image_tokens,
        image_pooled=F.normalize(image_tokens.mean(1), dim=-1),
        text_rows={f"class {c}": c for c in range(num_classes)}, text_tokens=text_tokens,
        text_offsets=torch.arange(0, 2 * num_classes + 1, 2),
        text_pooled=F.normalize(torch.randn(num_classes, width, generator=generator), dim=-1))
    pairs = [ImageTextPair(image=Path(f"{i}.png"), text=f"class {image_class[i]}", is_match=True, line_number=i + 1)
             for i in range(num_images)]
    return features, pairs


def test_training_keeps_the_best_validation_epoch_and_records_the_curve():
    import random

    from models.training.loop import TrainingConfig, evaluate, train_head
    from models.training.pairs import sample_mismatches

    features, pairs = _learnable()
    texts = sorted(features.text_rows)
    train, validation_images = pairs[:18], pairs[18:]
    validation = tuple(validation_images) + sample_mismatches(validation_images, texts, random.Random(0))
    head = fresh_head(LowRankCrossAttention(text_dim=8, image_dim=8, rank=4, backend="torch"), seed=0)
    config = TrainingConfig(batch_size=8, seed=0)
    plan = plan_training(36, 8, 8, epochs=40, learning_rate=0.05)  # a rate high enough to wander off its best
    run = train_head(head, features, train, validation_pairs=validation, sample_texts=texts, plan=plan,
                     config=config)
    aucs = [record.validation_auc for record in run.curve]
    assert run.num_steps == run.curve[-1].step
    if run.is_stopped_early:  # it waited out its patience after the best epoch, and not much longer
        waited = run.curve[-1].step - run.curve[run.best_epoch - 1].step
        assert plan.patience_steps <= waited < plan.patience_steps + plan.steps_per_epoch
    else:
        assert len(run.curve) == 40
    assert run.curve[run.best_epoch - 1].validation_auc == max(aucs)
    kept = evaluate(head, features, validation)
    assert kept.auc == pytest.approx(max(aucs)) and kept.loss == pytest.approx(run.curve[run.best_epoch - 1].validation_loss)
    assert [r.step for r in run.curve] == [5 * e for e in range(1, len(run.curve) + 1)]  # 36 examples, 8 a batch
    assert run.num_sampled_mismatches == 18 * len(run.curve)


@pytest.mark.parametrize("is_labelled", [False, True])
def test_held_out_validation_and_training_images_are_disjoint_and_each_set_has_both_classes(tmp_path, is_labelled):
    import json

    from PIL import Image

    from encoded_images import encode

    from models.training.loop import TrainingConfig
    from models.training.pairs import read_pairs, same_text
    from models.training.train_fusion import _make_sets

    records = []
    for i in range(40):
        (tmp_path / f"{i}.png").write_bytes(encode(Image.new("RGB", (4, 4), (i, 0, 0)), "PNG"))
        records.append({"image": f"{i}.png", "text": f"caption {i % 4}"})
        if is_labelled:
            records.append({"image": f"{i}.png", "text": f"caption {(i + 1) % 4}", "label": 0})
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    sets = _make_sets(read_pairs(path), TrainingConfig(seed=1))
    train_images = {p.image for p in sets.train}
    assert (len(sets.held_out_images), len(sets.validation_images), len(train_images)) == (8, 5, 27)
    assert train_images.isdisjoint(sets.validation_images) and train_images.isdisjoint(sets.held_out_images)
    assert sets.validation_images.isdisjoint(sets.held_out_images)
    assert {p.image for p in sets.validation} == sets.validation_images
    for pairs in (sets.validation, sets.held_out):
        matching = [p for p in pairs if p.is_match]
        mismatched = [p for p in pairs if not p.is_match]
        assert matching and mismatched
        own = {p.image: same_text(p.text) for p in matching}
        assert all(same_text(p.text) != own[p.image] for p in mismatched)
    # sampled: one held-out mismatch per image, three per validation image; labelled: the file's own lines
    assert len(sets.validation) == (5 * 2 if is_labelled else 5 * 4)
    assert len(sets.held_out) == 8 * 2 and (sets.sample_texts is None) is is_labelled


def test_no_threshold_above_1_the_floor_first_reaches_1_at_7_held_out_pairs_of_each_class():
    from models.training.verdict import is_passable, min_held_out_pairs_per_class

    assert min_held_out_auc(2, 2) > 1.0 and not is_passable(2, 2)  # 10 images hold out 2: 2 + 2 sampled
    assert not is_passable(6, 6) and is_passable(7, 7) and min_held_out_pairs_per_class() == 7
    assert min_held_out_auc(7, 7) <= 1.0
    with pytest.raises(ValueError, match="no AUC can meet the rule"):
        judge(1.0, 0.5, 2, 2)  # the verdict never records a floor no AUC reaches


def test_31_images_hold_out_the_7_pairs_of_each_class_the_verdict_needs(tmp_path):
    import json

    from PIL import Image

    from encoded_images import encode

    from models.errors import TrainingDataError
    from models.training.loop import TrainingConfig
    from models.training.pairs import read_pairs
    from models.training.train_fusion import _check_held_out_is_passable, _make_sets

    def pairs_of(num_images: int):
        path = tmp_path / f"{num_images}.jsonl"
        for i in range(num_images):
            (tmp_path / f"{i}.png").write_bytes(encode(Image.new("RGB", (4, 4), (i, 0, 0)), "PNG"))
        path.write_text("".join(json.dumps({"image": f"{i}.png", "text": f"caption {i % 4}"}) + "\n"
                                for i in range(num_images)))
        pairs_file = read_pairs(path)
        return _make_sets(pairs_file, TrainingConfig()), pairs_file

    sets, pairs_file = pairs_of(31)
    assert len(sets.held_out) == 7 + 7
    _check_held_out_is_passable(sets, pairs_file, TrainingConfig())
    sets, pairs_file = pairs_of(30)
    with pytest.raises(TrainingDataError, match="6 matching and 6 mismatched pairs"):
        _check_held_out_is_passable(sets, pairs_file, TrainingConfig())
