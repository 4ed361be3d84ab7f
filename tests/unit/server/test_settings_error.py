"""``settings_error``: pydantic's report on the settings as the one line ``mmserve serve`` prints."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from server.runtime.startup_checks import settings_error
from server.settings import Settings


SERVE_FLAGS = ("devices", "port", "engines", "preset")  # some of `mmserve serve`'s flags (argparse destinations)


def _line(**values: object) -> str:
    with pytest.raises(ValidationError) as raised:
        Settings(**values)
    return str(settings_error(raised.value, flags=SERVE_FLAGS))


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


def test_a_setting_without_a_flag_is_named_as_its_variable_and_config_key_not_as_a_flag_that_does_not_exist():
    """MMSERVE_MAX_BATCH_SIZE=abc said ``--max-batch-size``, which `mmserve serve` refuses as unrecognized."""
    line = _line(max_batch_size="abc")
    assert line.startswith("max_batch_size (MMSERVE_MAX_BATCH_SIZE): Input should be a valid integer")
    assert "--max-batch-size" not in line


def test_an_unknown_preset_is_refused_with_the_settings_not_when_the_model_loads():
    """MMSERVE_PRESET skips the flag's choices: it failed inside the lifespan, naming no setting."""
    line = _line(preset="vit-h14")
    assert line == ("--preset (MMSERVE_PRESET): unknown preset 'vit-h14'; "
                    "choose one of vit-l16, vit-b16, tiny, synthetic")
