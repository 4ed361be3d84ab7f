"""Device settings refused whatever the machine has: ``--device cpu`` with what only a GPU runs.

``--device cpu`` needs no CUDA probe to judge ``--dtype float16`` or
``--decode-device cuda``, so ``mmserve serve`` refuses them before it imports
torch (``server.runtime.startup_checks``); the engine's own plan
(``server.runtime.model_loading.plan_device``, ``models.precision``) words the
same refusals from here when the device was resolved on the machine.
"""

from __future__ import annotations

from models.errors import DeviceSettingError


def float16_on_cpu() -> DeviceSettingError:
    return DeviceSettingError(
        "--dtype float16 (MMSERVE_DTYPE) needs a CUDA device, and this server runs on the CPU (no CUDA device "
        "is visible, or --device cpu was given): CPUs have no fast float16 matrix path. Use --dtype float32 "
        "(the CPU default, or auto) or bfloat16")


def decode_device_on_cpu(why: str) -> DeviceSettingError:
    """``why``: why the server runs on the CPU (``--device cpu``, or no CUDA device is visible)."""
    return DeviceSettingError(
        "--decode-device cuda (MMSERVE_DECODE_DEVICE) decodes JPEGs with nvJPEG on the GPU, but this server "
        f"runs on the CPU ({why}); use --decode-device cpu")


def refuse_on_cpu(*, device: str, dtype: str, decode_device: str) -> None:
    """With ``device`` ``cpu`` as given (not resolved): the refusals ``plan_device`` would make, in its order."""
    if device != "cpu":
        return
    if dtype == "float16":
        raise float16_on_cpu()
    if decode_device == "cuda":
        raise decode_device_on_cpu("--device cpu")
