"""What ONNX Runtime cannot serve, refused by the settings (or ``plan_device``) before any weight loads."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from models.errors import DeviceSettingError
from server.runtime.model_loading import plan_device
from server.runtime.startup_checks import settings_error
from server.runtime_settings import runtime_conflict
from server.settings import Settings


def _refusal(**given: object) -> str:
    with pytest.raises(ValidationError) as raised:
        Settings(**given)
    return str(settings_error(raised.value))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_onnxruntime_with_a_half_dtype_is_refused_naming_both(dtype: str):
    assert _refusal(runtime="onnxruntime", dtype=dtype) == (
        f"--runtime onnxruntime (MMSERVE_RUNTIME) serves float32 and --dtype is {dtype} (MMSERVE_DTYPE): "
        "use --dtype float32 or auto, or use --runtime torch or auto")


def test_onnxruntime_with_the_synthetic_preset_is_refused_naming_both():
    line = _refusal(runtime="onnxruntime", preset="synthetic")
    assert line.startswith("--runtime onnxruntime (MMSERVE_RUNTIME) cannot serve --preset synthetic (MMSERVE_PRESET)")
    assert line.endswith("use --runtime torch or auto")


def test_int8_with_the_synthetic_preset_is_refused_naming_both():
    line = _refusal(quantize="int8", preset="synthetic")
    assert line.startswith("--quantize int8 (MMSERVE_QUANTIZE) needs ONNX Runtime, which cannot serve "
                           "--preset synthetic (MMSERVE_PRESET)") and line.endswith("leave --quantize out"), line
    line = _refusal(runtime="onnxruntime", quantize="int8", preset="synthetic")  # torch alone would refuse int8
    assert line.endswith("leave --quantize out and use --runtime torch or auto"), line


def test_int8_with_a_half_dtype_or_cuda_is_refused():
    assert "--dtype is bfloat16 (MMSERVE_DTYPE)" in _refusal(quantize="int8", dtype="bfloat16")
    assert "--device is cuda (MMSERVE_DEVICE)" in _refusal(runtime="onnxruntime", device="cuda")


def test_auto_is_not_refused_it_falls_back_to_torch():
    assert Settings(runtime="auto", dtype="bfloat16").runtime == "auto"
    assert Settings(runtime="auto", preset="synthetic").preset == "synthetic"
    assert Settings(runtime="auto", device="cuda").device == "cuda"
    # a repository or a model named beside the synthetic preset is what loads: judged once loaded
    assert Settings(runtime="onnxruntime", preset="synthetic", model_repo="/some/repo").runtime == "onnxruntime"


def test_auto_settings_resolved_on_the_machine_name_what_was_given():
    """``--dtype auto`` is bfloat16 on a GPU: ``plan_device`` judges the resolved values, naming the setting."""
    line = runtime_conflict(runtime="onnxruntime", quantize=None, device="cuda", dtype="bfloat16",
                            is_synthetic=False, device_setting="auto", dtype_setting="auto")
    assert line == ("--runtime onnxruntime (MMSERVE_RUNTIME) serves on the CPU here and --device is auto (cuda here) "
                    "(MMSERVE_DEVICE): use --device cpu, or use --runtime torch or auto")
    assert runtime_conflict(runtime="auto", quantize=None, device="cuda", dtype="bfloat16", is_synthetic=False) is None


def test_plan_device_refuses_before_loading_what_settings_could_not_judge():
    settings = Settings(device="cpu", runtime="onnxruntime").model_copy(update={"dtype": "bfloat16"})
    with pytest.raises(DeviceSettingError, match=r"--runtime onnxruntime .*--dtype is bfloat16"):
        plan_device(settings)
    assert plan_device(Settings(device="cpu", runtime="onnxruntime")).dtype == "float32"
