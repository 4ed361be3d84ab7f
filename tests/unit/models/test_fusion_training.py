"""The trainer's parts: the rank AUC, and a trained head read back beside a model repository."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.errors import ModelRepositoryError
from models.fusion_head_file import FUSION_HEAD_FILE, save_fusion_head
from models.training.loop import fresh_head, roc_auc
from models.families.pretrained import load_pretrained
from models.loading.repository import build_preset, fingerprint, load_repository, write_repository


@pytest.mark.parametrize(("scores", "labels", "auc"), [
    ([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1], 1.0),
    ([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1], 0.0),
    ([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1], 0.5),  # ties count a half
    ([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1], 0.75),  # the classic example: 3 of 4 pairs ordered
    ([0.3, 0.3, 0.7, 0.1, 0.3], [1, 0, 1, 0, 0], (0.5 + 1 + 0.5 + 3) / 6),  # 0.3 ties two, beats 0.1; 0.7 beats all
])
def test_roc_auc_is_the_share_of_matching_mismatched_pairs_ordered(scores, labels, auc):
    assert roc_auc(torch.tensor(scores), torch.tensor(labels, dtype=torch.float32)) == pytest.approx(auc)


def test_roc_auc_needs_both_classes():
    with pytest.raises(ValueError, match="both classes"):
        roc_auc(torch.tensor([0.1, 0.2]), torch.tensor([1.0, 1.0]))


def _trained_head_beside(repository: Path, seed: int = 7) -> Path:
    bundle = load_repository(repository)
    head = fresh_head(bundle.model.fusion, seed)
    towers = fingerprint(bundle.model, bundle.tokenizer, bundle.config, skip_prefix="fusion.")
    path = repository / FUSION_HEAD_FILE
    save_fusion_head(path, head, towers_fingerprint=towers, is_trained=True, card={"held_out": {"auc": 0.97}})
    return path


def test_a_repository_serves_the_trained_head_beside_it_under_a_new_fingerprint(tmp_path: Path):
    repository = tmp_path / "tiny"
    write_repository(repository, build_preset("tiny", seed=0))
    untrained = load_repository(repository)
    _trained_head_beside(repository)
    served = load_pretrained(str(repository))  # --model DIR of an mmserve repository
    assert served.fusion_head.is_trained and served.describe().fusion_head == "trained"
    assert served.fusion_head.card == {"held_out": {"auc": 0.97}}
    assert torch.equal(served.model.fusion.q_proj.weight, fresh_head(untrained.model.fusion, 7).q_proj.weight)
    assert served.fingerprint != untrained.fingerprint  # cached K/V/Q of the old head are never served
    fresh = load_repository(repository, is_trained_head_read=False)
    assert not fresh.fusion_head.is_trained and fresh.fingerprint == untrained.fingerprint


def test_a_head_trained_on_other_towers_is_refused(tmp_path: Path):
    first, second = tmp_path / "seed0", tmp_path / "seed1"
    write_repository(first, build_preset("tiny", seed=0))
    write_repository(second, build_preset("tiny", seed=1))
    head = _trained_head_beside(first)
    with pytest.raises(ModelRepositoryError, match="trained on other towers"):
        load_repository(second, fusion_head=head)
    with pytest.raises(ModelRepositoryError, match="does not exist"):
        load_repository(second, fusion_head=tmp_path / "absent.safetensors")


def test_a_head_path_that_is_a_directory_says_so_and_names_the_file_in_it(tmp_path: Path):
    """`mmserve train-fusion --out DIR` writes DIR/fusion_head.safetensors: DIR is what a user passes by mistake."""
    repository = tmp_path / "tiny"
    write_repository(repository, build_preset("tiny", seed=0))
    head = _trained_head_beside(repository)
    in_it = f"is a directory, not a safetensors file: give the file in it, {head}$"
    with pytest.raises(ModelRepositoryError, match=in_it):
        load_repository(repository, fusion_head=repository)
    with pytest.raises(ModelRepositoryError, match=r"is a directory, not a safetensors file$"):
        load_repository(repository, fusion_head=tmp_path)


def test_packed_text_rows_gather_each_texts_own_tokens_in_order():
    from models.training.features import TowerFeatures

    lengths = [2, 3, 1]
    offsets = torch.tensor([0, 2, 5, 6])
    features = TowerFeatures(image_rows={}, image_tokens=torch.zeros(0, 1, 1), image_pooled=torch.zeros(0, 1),
                             text_rows={}, text_tokens=torch.arange(6.0)[:, None], text_offsets=offsets,
                             text_pooled=torch.zeros(3, 1))
    rows, cu_seqlens = features.packed_text_rows(torch.tensor([2, 0, 1, 0]))
    assert rows.tolist() == [5, 0, 1, 2, 3, 4, 0, 1] and sum(lengths) == 6
    assert cu_seqlens.tolist() == [0, 1, 3, 6, 8] and cu_seqlens.dtype == torch.int32
