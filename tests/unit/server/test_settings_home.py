"""``~`` in a path setting expands to the home directory however the setting is given (file, variable, flag)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.runtime.runtime_choice import export_cache_dir
from server.settings import load_settings


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MMSERVE_EXPORT_CACHE_DIR", raising=False)  # the suite's shared cache (tests/conftest.py)
    return tmp_path / "home"


def test_export_cache_dir_from_a_config_file_expands_home(tmp_path: Path, home: Path):
    config = tmp_path / "mmserve.yaml"
    config.write_text("export_cache_dir: ~/onnx-cache\n")
    settings = load_settings(config)
    assert settings.export_cache_dir == home / "onnx-cache"
    assert export_cache_dir(settings) == home / "onnx-cache"


def test_export_cache_dir_expands_home_from_a_variable_or_a_flag_alike(home: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MMSERVE_EXPORT_CACHE_DIR", "~/from-env")  # quoted: the shell left it alone
    assert load_settings().export_cache_dir == home / "from-env"
    assert load_settings(export_cache_dir=Path("~/from-flag")).export_cache_dir == home / "from-flag"


def test_the_other_path_settings_expand_home_from_a_config_file(tmp_path: Path, home: Path):
    config = tmp_path / "mmserve.yaml"
    config.write_text("model_repo: ~/repo\nfusion_head: ~/head.safetensors\napi_key_file: ~/keys\n")
    settings = load_settings(config)
    assert (settings.model_repo, settings.fusion_head, settings.api_key_file) == (
        home / "repo", home / "head.safetensors", home / "keys")
