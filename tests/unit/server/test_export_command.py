"""``mmserve export`` refusing a runtime names where the setting may have come from."""

from __future__ import annotations

import pytest

from models.errors import DeviceSettingError
from server.export_command import run_export
from server.settings import Settings


def test_a_torch_runtime_from_the_environment_is_named_by_its_variable_too(monkeypatch):
    monkeypatch.setenv("MMSERVE_RUNTIME", "torch")  # set for `mmserve serve`; export was given no --runtime
    with pytest.raises(DeviceSettingError, match=r"--runtime torch \(MMSERVE_RUNTIME"):
        run_export(Settings(preset="tiny"))
