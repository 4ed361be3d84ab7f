"""``settings_error``: pydantic's report on the settings as the one line ``mmserve serve`` prints."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from server.runtime.startup_checks import settings_error
from server.settings import Settings


def _line(**values: object) -> str:
    with pytest.raises(ValidationError) as raised:
        Settings(**values)
    return str(settings_error(raised.value))


def test_a_fields_validator_message_is_given_as_raised_with_its_value_once():
    line = _line(devices="gpu0")
    assert line == "--devices (MMSERVE_DEVICES): each device must be cpu or cuda:N, got 'gpu0'"


def test_a_type_error_names_the_flag_and_the_value():
    assert _line(port=99999) == "--port (MMSERVE_PORT): Input should be less than or equal to 65535 (got 99999)"


def test_a_check_across_settings_is_its_message_alone_not_every_value_given():
    line = _line(engines=3, devices="cpu")
    assert line.startswith("--engines 3 (MMSERVE_ENGINES) and --devices cpu (MMSERVE_DEVICES, 1 engine) disagree")
    assert "--settings" not in line and "Value error" not in line and "{" not in line


def test_devices_beside_engines_that_agree_or_no_engines_at_all_are_accepted():
    assert Settings(devices="cpu,cpu", engines=2).devices == ["cpu", "cpu"]
    assert Settings(devices="cpu,cpu").engines == 1  # devices sets the count where the server plans engines
