"""Both runtimes for the reference-equality tests: a loaded bundle as it serves under ``torch`` or ``onnxruntime``.

The ONNX graphs come from the test run's shared export cache (``tests/conftest.py``), so each model is exported
once per run.
"""

from __future__ import annotations

import os
from pathlib import Path

from models.loading.repository import ModelBundle
from models.onnx.towers import OnnxPlan, serve_towers_from_onnx

RUNTIMES = ("torch", "onnxruntime")


def on_runtime(bundle: ModelBundle, runtime: str) -> ModelBundle:
    """``bundle`` with its towers on ``runtime`` (torch: as loaded, eager)."""
    if runtime == "onnxruntime":
        serve_towers_from_onnx(bundle.model, bundle.fingerprint,
                               OnnxPlan(cache_dir=Path(os.environ["MMSERVE_EXPORT_CACHE_DIR"])))
    assert bundle.model.runtime == runtime
    return bundle
