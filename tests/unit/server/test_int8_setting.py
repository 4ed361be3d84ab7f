"""``--quantize int8`` beside ``--runtime torch``: refused by the settings themselves, before any weight loads."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from server.runtime.startup_checks import settings_error
from server.settings import Settings


def test_int8_with_the_torch_runtime_is_refused_before_the_model_loads():
    with pytest.raises(ValidationError) as raised:
        Settings(runtime="torch", quantize="int8")
    assert str(settings_error(raised.value)) == (
        "--quantize int8 (MMSERVE_QUANTIZE) runs in ONNX Runtime only; with --runtime torch (MMSERVE_RUNTIME) "
        "leave it out (or use --runtime onnxruntime or auto)")


def test_int8_with_auto_or_onnx_runtime_is_accepted():
    assert Settings(runtime="auto", quantize="int8").quantize == "int8"
    assert Settings(runtime="onnxruntime", quantize="int8").quantize == "int8"
