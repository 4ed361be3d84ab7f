"""Which runtime runs the towers (``--runtime auto|torch|onnxruntime``), and putting the towers on it.

    --runtime      CPU, float32, a real model or the tiny/ViT presets    CUDA, another dtype, the synthetic preset
    auto           ONNX Runtime; torch (logged why) if a graph           torch (logged why)
                   cannot be exported or disagrees with torch,
                   or the export cache cannot be written or read
    torch          torch (TorchScript graphs or eager; CUDA graphs on CUDA)
    onnxruntime    ONNX Runtime, or exit naming why                       exit naming why

Under ONNX Runtime ``torchscript_encoders`` and ``cuda_graphs`` have nothing
to act on and are ignored (logged). ``compute_threads`` sets the intra-op
threads of whichever runtime computes. The runtime that serves is part of
the model's fingerprint (``models.loading.repository.with_runtime``), its
``model`` object, ``/v1/models`` and ``mmserve_model_info``.
"""

from __future__ import annotations

import logging

import torch

from models.errors import DeviceSettingError, OnnxExportError, QuantizationError
from models.families.presets import SYNTHETIC_ARCHITECTURE
from models.loading.repository import ModelBundle, with_runtime
from models.onnx.towers import OnnxPlan, serve_towers_from_onnx
from server.runtime.startup_checks import export_cache_dir
from server.settings import Settings

logger = logging.getLogger(__name__)


def onnx_unavailable_reason(bundle: ModelBundle) -> str | None:
    """Why ONNX Runtime cannot serve ``bundle`` here, before trying; None when it may."""
    model = bundle.model
    if bundle.config.vision.architecture == SYNTHETIC_ARCHITECTURE:
        return "the synthetic preset's towers sleep for drawn times instead of computing; they stay in torch"
    if model.device.type != "cpu":
        return f"ONNX Runtime serves on the CPU here and the model is on {model.device} (torch's CUDA graphs serve it)"
    if bundle.config.dtype != "float32":
        return f"ONNX Runtime serves float32 here and --dtype is {bundle.config.dtype}"
    return None


def apply_threads(settings: Settings) -> None:
    """``compute_threads`` for torch's pool (the ONNX Runtime sessions take it in ``OnnxPlan``)."""
    if settings.compute_threads is not None:
        torch.set_num_threads(settings.compute_threads)


def choose_runtime(bundle: ModelBundle, settings: Settings) -> ModelBundle:
    """Put ``bundle``'s towers on the runtime ``settings.runtime`` asks for (the module's table).

    Returns the bundle as served (its ``runtime`` and fingerprint); raises
    ``OnnxExportError`` (the export cache's OS errors included, naming
    ``--export-cache-dir``) or ``DeviceSettingError`` when ``--runtime onnxruntime``
    cannot be met, ``QuantizationError`` when ``--quantize`` cannot (under
    either runtime setting: int8 is never silently dropped). Torch's graphs (TorchScript, CUDA graphs) are the caller's
    to set up after, when this returns torch.
    """
    apply_threads(settings)
    model = bundle.model
    quantization = settings.quantize or "none"
    if settings.runtime == "torch":
        if settings.quantize is not None:
            raise QuantizationError(f"--quantize {settings.quantize} runs in ONNX Runtime only; with --runtime torch "
                                    "leave it out (or use --runtime onnxruntime)")
        _leave_onnx(bundle)
        return with_runtime(bundle, "torch")
    reason = onnx_unavailable_reason(bundle)
    if reason is not None and settings.quantize is not None:
        raise QuantizationError(f"--quantize {settings.quantize} needs ONNX Runtime, which cannot serve here: {reason}")
    if reason is not None:
        if settings.runtime == "onnxruntime":
            raise DeviceSettingError(f"--runtime onnxruntime (MMSERVE_RUNTIME): {reason}; use --runtime torch or auto")
        if bundle.config.vision.architecture != SYNTHETIC_ARCHITECTURE:
            logger.info("--runtime auto: torch runs the towers (%s)", reason)
        _leave_onnx(bundle)
        return with_runtime(bundle, "torch")
    # Only what the user set: both are on by default, and a default the user never gave is not "ignored".
    ignored = [name for name in ("torchscript_encoders", "cuda_graphs")
               if getattr(settings, name) and name in settings.model_fields_set]
    model.drop_encoder_graphs()
    plan = OnnxPlan(cache_dir=export_cache_dir(settings), intra_op_threads=settings.compute_threads,
                    quantization=quantization, min_cosine=settings.quantize_min_cosine)
    try:
        towers = serve_towers_from_onnx(model, bundle.torch_fingerprint or bundle.fingerprint, plan)
    except (OnnxExportError, QuantizationError) as e:
        model.drop_encoder_graphs()
        if settings.runtime == "onnxruntime" or settings.quantize is not None:
            raise  # start-up ends with its one line (it named --runtime onnxruntime under auto's --quantize too)
        logger.warning("--runtime auto: torch runs the towers, ONNX Runtime cannot: %s", e)
        return with_runtime(bundle, "torch")
    how = "exported to" if towers.is_exported else "read from the export cache"
    if towers.waited_s >= 0.05:  # another server held the key's lock: most of the time was its export
        how = f"waited {towers.waited_s:.1f} s for another process exporting the same graphs, then {how}"
    logger.info("the towers run in ONNX Runtime (%s %s in %.1f s; %s intra-op threads each, no spinning)%s",
                how, towers.directory, towers.elapsed_s, settings.compute_threads or "default",
                f"; {' and '.join(ignored)} ignored under ONNX Runtime" if ignored else "")
    if towers.int8_cosine is not None:
        logger.info("--quantize %s: cosine of int8 to float32 outputs on the probe set %.5f (floor %s)",
                    quantization, towers.int8_cosine, settings.quantize_min_cosine)
    return with_runtime(bundle, "onnxruntime", quantization, towers.int8_cosine)


def _leave_onnx(bundle: ModelBundle) -> None:
    """A model shared between apps (tests) may hold another app's ONNX sessions: back to torch."""
    if bundle.model.runtime != "torch":
        bundle.model.drop_encoder_graphs()


def log_served_model(bundle: ModelBundle) -> None:
    """The start-up line naming what serves: model, device, dtype, runtime and the fingerprint cache keys carry."""
    logger.info("model %s on %s in %s, runtime %s%s, fingerprint %s", bundle.config.name, bundle.model.device,
                bundle.config.dtype, bundle.runtime,
                "" if bundle.quantization == "none" else f" ({bundle.quantization})", bundle.fingerprint)
