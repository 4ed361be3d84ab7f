"""Put both towers on ONNX Runtime: graphs from the export cache (or exported now), sessions, a probe check.

    serve_towers_from_onnx(model, plan)
        key    = ExportKey(model fingerprint, runtime, torch and ONNX Runtime versions, opset, quantization)
        graphs = the cache's entry for key, else export both towers into a new entry (models.onnx.export_cache)
        each tower: session (models.onnx.session), then compared with the torch forward on a probe batch;
        all agree -> encoder.graph = the session; else the entry is removed and OnnxExportError says why

A graph serves only after it computed what torch computes on inputs other than
the export's example (other batch sizes, other lengths, padded and unpadded
texts): each probe row's tokens (the real ones) and embedding within
``PROBE_MAX_RELATIVE_ERROR`` of torch's in L2 norm (cosine >= 1 - e**2 / 2).
A cached graph that fails is removed, so the next start exports again; the
caller decides whether torch serves instead (``--runtime auto``) or the
server stops (``--runtime onnxruntime``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort
import torch

from models.errors import OnnxExportError
from models.multimodal import MultimodalModel
from models.onnx.export import OPSET, export_text, export_vision, text_example, vision_example
from models.onnx.export_cache import ExportCache, ExportKey
from models.onnx.session import OnnxForward

logger = logging.getLogger(__name__)

RUNTIME = "onnxruntime"
VISION_GRAPH = "vision.onnx"
TEXT_GRAPH = "text.onnx"
PROBE_MAX_RELATIVE_ERROR = 1e-3  # ||onnx - torch|| / ||torch|| per row: cosine >= 0.9999995


@dataclass(frozen=True)
class OnnxPlan:
    """Where graphs are cached and how sessions run."""

    cache_dir: Path
    intra_op_threads: int | None = None  # the compute_threads setting; None: ONNX Runtime's default
    quantization: str = "none"


@dataclass(frozen=True)
class OnnxTowers:
    """What ``serve_towers_from_onnx`` did: where the graphs are, and whether it exported them."""

    directory: Path
    key: ExportKey
    is_exported: bool  # False: read from the cache
    elapsed_s: float  # export (if any), sessions and probe check


def export_key(fingerprint: str, quantization: str = "none") -> ExportKey:
    return ExportKey(fingerprint=fingerprint, runtime=RUNTIME, exporter=f"torch {torch.__version__}",
                     onnxruntime=ort.__version__, opset=OPSET, quantization=quantization)


def export_graphs(model: MultimodalModel, directory: Path) -> None:
    """Write both towers' graphs into ``directory`` (eager modules: any ``graph`` is bypassed)."""
    if model.device.type != "cpu":
        raise OnnxExportError(f"ONNX Runtime serves on the CPU; this model is on {model.device}")
    if model.vision.parameter_dtype() != torch.float32:
        raise OnnxExportError(f"ONNX Runtime serves float32 here; this model computes in "
                              f"{model.vision.parameter_dtype()} (--dtype float32 or auto on the CPU)")
    export_vision(model.vision, directory / VISION_GRAPH)
    export_text(model.text, directory / TEXT_GRAPH)


def ensure_exported(model: MultimodalModel, cache: ExportCache, key: ExportKey) -> tuple[Path, bool]:
    """``key``'s cache entry, exported now if the cache has none; and whether it was exported now."""
    found = cache.lookup(key)
    if found.directory is not None:
        return found.directory, False
    if key.quantization != "none":
        raise OnnxExportError(f"quantization {key.quantization!r} is not available in this build")
    logger.info("exporting the towers to ONNX into %s (once per model; later starts read it)", cache.root)
    return cache.store(key, lambda directory: export_graphs(model, directory)), True


def serve_towers_from_onnx(model: MultimodalModel, fingerprint: str, plan: OnnxPlan) -> OnnxTowers:
    """Run both towers from ONNX Runtime sessions from now on (the module docstring); raises ``OnnxExportError``."""
    started = time.perf_counter()
    cache = ExportCache(plan.cache_dir)
    key = export_key(fingerprint, plan.quantization)
    if _holds_graphs_of(model, key):  # a model shared between apps, already on these graphs
        return OnnxTowers(model.vision.graph.path.parent, key, False, 0.0)
    directory, is_exported = ensure_exported(model, cache, key)
    try:
        vision = OnnxForward("vision", directory / VISION_GRAPH, plan.intra_op_threads, key.digest())
        text = OnnxForward("text", directory / TEXT_GRAPH, plan.intra_op_threads, key.digest())
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own untyped errors for a graph it cannot load
        cache.remove(key)
        raise OnnxExportError(f"ONNX Runtime cannot load the graphs in {directory}: {e}") from e
    mismatch = probe_mismatch(model, vision, text)
    if mismatch is not None:
        cache.remove(key)
        raise OnnxExportError(f"the ONNX graphs in {directory} do not compute what torch computes: {mismatch}")
    model.vision.graph, model.text.graph = vision, text
    return OnnxTowers(directory, key, is_exported, time.perf_counter() - started)


def _holds_graphs_of(model: MultimodalModel, key: ExportKey) -> bool:
    return all(isinstance(encoder.graph, OnnxForward) and encoder.graph.key_digest == key.digest()
               for encoder in (model.vision, model.text))


def _row_error(want: torch.Tensor, got: torch.Tensor) -> float:
    """The largest relative L2 error over rows of (B, ...) tensors."""
    want, got = want.float().flatten(1), got.float().flatten(1)  # (B, N) each
    return float(((want - got).norm(dim=1) / want.norm(dim=1).clamp_min(1e-12)).max())


def probe_mismatch(model: MultimodalModel, vision: OnnxForward, text: OnnxForward,
                   max_relative_error: float = PROBE_MAX_RELATIVE_ERROR) -> str | None:
    """What differs between the graphs and the torch forward on the probe batches; None when they agree."""
    width = model.text.fixed_length or min(16, model.text.max_tokens)
    probes = [
        ("vision", vision, model.vision.features, vision_example(model.vision, 1, seed=1), None),
        ("vision", vision, model.vision.features, vision_example(model.vision, 3, seed=2), None),
        ("text", text, model.text.encode, text_example(model.text, [width], width, seed=1), [width]),
        ("text", text, model.text.encode,
         text_example(model.text, [width, 1, max(1, width // 2)], width, seed=2), [width, 1, max(1, width // 2)]),
    ]
    with torch.inference_mode():
        for tower, graph, forward, inputs, lengths in probes:
            want, got = forward(*inputs), graph(*inputs)
            for name, expected, actual in zip(("tokens", "pooled"), want, got, strict=True):
                if tuple(expected.shape) != tuple(actual.shape):
                    return f"{tower} {name} has shape {tuple(actual.shape)}, torch {tuple(expected.shape)}"
                if name == "tokens" and lengths is not None:  # the fusion head reads the real tokens only
                    expected = torch.cat([expected[i, :n] for i, n in enumerate(lengths)])[None]
                    actual = torch.cat([actual[i, :n] for i, n in enumerate(lengths)])[None]
                error = _row_error(expected, actual)
                if not error <= max_relative_error:
                    shape = tuple(inputs[0].shape)
                    return (f"{tower} {name} on inputs of shape {shape} is {error:.3g} off torch's "
                            f"(relative L2), more than {max_relative_error:g}")
    return None
