"""Settings precedence: defaults < YAML file < MMSERVE_* environment < CLI flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from server.settings import ConfigFileError, Settings, load_settings


def test_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    config = tmp_path / "mmserve.yaml"
    config.write_text("max_batch_size: 2\nmax_queue_size: 9\nport: 1234\npreset: tiny\n")
    monkeypatch.setenv("MMSERVE_MAX_BATCH_SIZE", "4")
    monkeypatch.setenv("MMSERVE_PORT", "4321")
    settings = load_settings(config, port=5555, preset=None)
    assert settings.max_batch_size == 4  # env beats the file
    assert settings.max_queue_size == 9  # the file beats the default
    assert settings.port == 5555  # a flag beats the env
    assert settings.preset == "tiny"  # a flag left out does not override
    assert settings.max_queue_delay_ms == Settings().max_queue_delay_ms


def test_per_lane_overrides(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MMSERVE_MAX_BATCH_SIZE", "16")
    monkeypatch.setenv("MMSERVE_VISION_MAX_BATCH_SIZE", "4")
    settings = Settings()
    assert settings.lane_value("vision", "max_batch_size") == 4
    assert settings.lane_value("text", "max_batch_size") == 16


def test_unknown_and_invalid_settings_are_refused(tmp_path: Path):
    config = tmp_path / "bad.yaml"
    config.write_text("max_batchsize: 3\n")
    with pytest.raises(ConfigFileError, match=f"^max_batchsize in {config}: .*did you mean max_batch_size"):
        load_settings(config)
    with pytest.raises(ValidationError, match="max_batch_size"):
        Settings(max_batch_size=0)


@pytest.mark.parametrize("content", [None, "- a list\n", "port: [\n"])
def test_a_config_file_that_is_missing_or_not_settings_names_config_and_the_path(tmp_path: Path, content: str | None):
    """A typo in the path must not start the server on defaults."""
    config = tmp_path / "mmserve.yaml"
    if content is not None:
        config.write_text(content)
    with pytest.raises(ConfigFileError, match=f"^--config {config}: "):
        load_settings(config, preset="tiny")
    with pytest.raises(ConfigFileError, match=f"^--config {tmp_path}: cannot read"):  # a directory
        load_settings(tmp_path)


def test_an_empty_config_file_is_the_defaults(tmp_path: Path):
    config = tmp_path / "empty.yaml"
    config.write_text("# nothing set yet\n")
    assert load_settings(config) == Settings()
