"""Start-up says which fusion head runs, and refuses a head it cannot check against its towers."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from models.errors import ModelRepositoryError
from models.loading.repository import build_preset, write_repository
from server.runtime.model_loading import load_model
from server.settings import Settings


def test_a_head_file_with_a_preset_is_refused_rather_than_ignored(tmp_path: Path):
    with pytest.raises(ModelRepositoryError, match="needs the model it was trained on"):
        load_model(Settings(preset="tiny", device="cpu", fusion_head=tmp_path / "fusion_head.safetensors"))


def test_an_untrained_head_is_warned_about_at_start_up_for_a_repository(tmp_path: Path, caplog):
    write_repository(tmp_path / "tiny", build_preset("tiny"))
    with caplog.at_level(logging.WARNING, logger="server.runtime.model_loading"):
        bundle = load_model(Settings(model_repo=tmp_path / "tiny", device="cpu"))
    assert not bundle.fusion_head.is_trained
    assert f"the fusion head of {tmp_path / 'tiny'} is untrained" in caplog.text
