"""Settings that ask ONNX Runtime (``--runtime onnxruntime``, ``--quantize int8``) for what it cannot serve.

ONNX Runtime serves the real models and the tiny/ViT presets on the CPU in
float32 (``server.runtime.runtime_choice``). Anything else was refused only
once the model had loaded; each combination below needs no weight to judge,
so it is refused before loading, in one line naming both settings:

    asked                                   beside                            judged by
    --quantize int8                         --runtime torch                   Settings
    --runtime onnxruntime / --quantize int8  --preset synthetic (no model)    Settings
    --runtime onnxruntime / --quantize int8  --dtype bfloat16 | float16       Settings
    --runtime onnxruntime / --quantize int8  --device cuda                    Settings
    the same                                auto's device/dtype resolved      ``plan_device`` (before loading)

``--runtime auto`` without ``--quantize`` is never refused: it falls back to
torch and logs why. Pure functions of the values, so ``Settings`` (which
holds ``auto``) and ``plan_device`` (which holds the machine's answer) share
them.
"""

from __future__ import annotations

_SYNTHETIC_WHY = "the synthetic preset's towers sleep for drawn times instead of computing and stay in torch"


def runtime_conflict(*, runtime: str, quantize: str | None, device: str, dtype: str, is_synthetic: bool,
                     device_setting: str | None = None, dtype_setting: str | None = None) -> str | None:
    """The one-line refusal for these settings, or None when nothing here conflicts.

    ``device``/``dtype``: as given (``auto`` is not judged) or as resolved on this machine; ``*_setting``: what the
    user gave, named beside a resolved value that differs (``--device auto (cuda here)``).
    """
    if quantize is not None and runtime == "torch":
        return (f"--quantize {quantize} (MMSERVE_QUANTIZE) runs in ONNX Runtime only; with --runtime torch "
                "(MMSERVE_RUNTIME) leave it out (or use --runtime onnxruntime or auto)")
    if runtime == "onnxruntime":
        asked = "--runtime onnxruntime (MMSERVE_RUNTIME)"
        instead = ("use --runtime torch or auto" if quantize is None
                   else "leave --quantize out and use --runtime torch or auto")  # torch alone refuses int8
    elif quantize is not None:
        asked = f"--quantize {quantize} (MMSERVE_QUANTIZE) needs ONNX Runtime, which"
        instead = "leave --quantize out"
    else:
        return None  # auto: falls back to torch, logged
    if is_synthetic:
        return f"{asked} cannot serve --preset synthetic (MMSERVE_PRESET): {_SYNTHETIC_WHY}; {instead}"
    if device not in ("auto", "cpu"):
        given = _given(device, device_setting)
        return (f"{asked} serves on the CPU here and --device is {given} (MMSERVE_DEVICE): use --device cpu, "
                f"or {instead}")
    if dtype not in ("auto", "float32"):
        given = _given(dtype, dtype_setting)
        return (f"{asked} serves float32 and --dtype is {given} (MMSERVE_DTYPE): use --dtype float32 or auto, "
                f"or {instead}")
    return None


def _given(resolved: str, setting: str | None) -> str:
    return resolved if setting is None or setting == resolved else f"{setting} ({resolved} here)"
