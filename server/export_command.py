"""``mmserve export``: fill the export cache ahead of time, so a container or pod starts without exporting.

Loads the model exactly as ``mmserve serve`` with the same model settings would, on the CPU
in float32 (same fingerprint, so the same cache key; a ``device`` or ``dtype`` from
MMSERVE_* or a config file is overridden, as export has neither flag), puts its towers on ONNX Runtime
(export, probe check against torch) and prints where the graphs are. A
later ``mmserve serve`` with the same model, settings and ``export_cache_dir``
reads them instead of exporting.
"""

from __future__ import annotations

from models.errors import DeviceSettingError
from server.runtime.model_loading import load_model
from server.runtime.runtime_choice import choose_runtime, export_cache_dir, onnx_unavailable_reason
from server.settings import Settings


def run_export(settings: Settings) -> int:
    """Export (or find) ``settings``' model's graphs; 0 when ONNX Runtime can serve it, else raises the reason."""
    if settings.runtime == "torch":
        raise DeviceSettingError("mmserve export --runtime torch (MMSERVE_RUNTIME, which may be meant for "
                                 "`mmserve serve`): torch runs the modules themselves and has nothing to export; use "
                                 "--runtime onnxruntime (or auto)")
    # ONNX Runtime serves the CPU in float32 only: a device or dtype from the environment or a config file
    # (meant for `mmserve serve`) would refuse the export naming a flag export does not have.
    # The runtime as given while loading: plan_device would name --runtime onnxruntime, a flag not given here.
    settings = settings.model_copy(update={"device": "cpu", "dtype": "float32"})
    bundle = load_model(settings)
    settings = settings.model_copy(update={"runtime": "onnxruntime"})
    reason = onnx_unavailable_reason(bundle)  # said as export's need, not as a --runtime flag the user never gave
    if reason is not None:
        raise DeviceSettingError(f"mmserve export writes ONNX Runtime graphs, and ONNX Runtime cannot serve "
                                 f"{bundle.config.name}: {reason}; `mmserve serve` runs it in torch, with nothing "
                                 "to export")
    bundle = choose_runtime(bundle, settings)
    graph = bundle.model.vision.graph
    print(f"ONNX graphs of {bundle.config.name} (fingerprint {bundle.fingerprint}) in {graph.path.parent} "
          f"(export cache {export_cache_dir(settings)})")
    return 0
