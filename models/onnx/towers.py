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
A cached graph that fails (it cannot load or run, or computes something
else) is removed and exported again in the same start; a graph exported now
that fails is removed too, and the caller decides whether torch serves
instead (``--runtime auto``) or the server stops (``--runtime onnxruntime``).
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort
import torch

from models.errors import OnnxExportError, QuantizationError
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
    quantization: str = "none"  # "int8": the towers' matrix multiplies quantized (models.onnx.quantize)
    min_cosine: float = 0.99  # int8 only: the floor of int8-to-float32 cosine on the probe set


@dataclass(frozen=True)
class OnnxTowers:
    """What ``serve_towers_from_onnx`` did: where the graphs are, and whether it exported them."""

    directory: Path
    key: ExportKey
    is_exported: bool  # False: read from the cache
    elapsed_s: float  # export (if any), sessions and probe check; waited_s included
    int8_cosine: float | None = None  # int8 only: the lowest cosine of int8 to float32 outputs on the probe set
    waited_s: float = 0.0  # of elapsed_s, waiting for another process exporting the same key (ExportCache.exporting)


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


def ensure_exported(model: MultimodalModel, cache: ExportCache, key: ExportKey) -> tuple[Path, bool, float]:
    """``key``'s cache entry, exported now if the cache has none; whether it was exported now; and the seconds
    spent waiting for another process's export of it.

    Several engines starting at once (``--engines N``) export once: the first
    takes the key's lock and exports, the others wait on it and read its entry.
    """
    with cache.exporting(key) as waited_s:
        found = cache.lookup(key)
        if found.directory is not None:
            return found.directory, False, waited_s
        logger.info("exporting the towers to ONNX into %s (once per model; later starts read it)", cache.root)
        if key.quantization == "none":
            return cache.store(key, lambda directory: export_graphs(model, directory)), True, waited_s
        return cache.store(key, lambda directory: _export_int8(model, directory)), True, waited_s


def _export_int8(model: MultimodalModel, directory: Path) -> None:
    """Export float32 graphs beside ``directory``'s, quantize their matrix multiplies into it, drop the float32."""
    from models.onnx.quantize import quantize_onnx_int8  # onnxruntime.quantization: only when int8 is asked

    float32 = directory / "float32"
    float32.mkdir()
    export_graphs(model, float32)
    for name in (VISION_GRAPH, TEXT_GRAPH):
        quantize_onnx_int8(float32 / name, directory / name)
    shutil.rmtree(float32)


def serve_towers_from_onnx(model: MultimodalModel, fingerprint: str, plan: OnnxPlan) -> OnnxTowers:
    """Run both towers from ONNX Runtime sessions from now on (the module docstring); raises ``OnnxExportError``.

    Graphs read from the cache that ONNX Runtime cannot load or run, or that do not compute what torch
    computes (a manifest that passed its checks over graphs of other weights or shapes), are removed and
    exported again, once, in this start: only graphs exported now and still wrong end it.
    """
    started = time.perf_counter()
    cache = ExportCache(plan.cache_dir)
    key = export_key(fingerprint, plan.quantization)
    if _holds_graphs_of(model, key):  # a model shared between apps, already on these graphs
        return OnnxTowers(model.vision.graph.path.parent, key, False, 0.0)
    directory, is_exported, waited_s = ensure_exported(model, cache, key)
    try:
        vision, text, int8_cosine = _checked_graphs(model, directory, key, plan)
    except OnnxExportError as e:
        cache.remove(key)
        if is_exported:
            raise
        logger.warning("%s: removed, exporting them again", e)
        directory, is_exported, waited_again_s = ensure_exported(model, cache, key)
        waited_s += waited_again_s
        try:
            vision, text, int8_cosine = _checked_graphs(model, directory, key, plan)
        except OnnxExportError:
            cache.remove(key)
            raise
    model.vision.graph, model.text.graph = vision, text
    return OnnxTowers(directory, key, is_exported, time.perf_counter() - started, int8_cosine, waited_s)


def _checked_graphs(model: MultimodalModel, directory: Path, key: ExportKey,
                    plan: OnnxPlan) -> tuple[OnnxForward, OnnxForward, float | None]:
    """The graphs in ``directory`` loaded and checked against torch: ``OnnxExportError`` if they cannot load or
    run or compute something else; ``QuantizationError`` below the int8 floor. The cosine for int8, else None."""
    try:
        vision = OnnxForward("vision", directory / VISION_GRAPH, plan.intra_op_threads, key.digest())
        text = OnnxForward("text", directory / TEXT_GRAPH, plan.intra_op_threads, key.digest())
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own untyped errors for a graph it cannot load
        raise OnnxExportError(f"ONNX Runtime cannot load the graphs in {directory}: {e}") from e
    if key.quantization == "none":
        mismatch = probe_mismatch(model, vision, text)
        if mismatch is not None:
            raise OnnxExportError(f"the ONNX graphs in {directory} do not compute what torch computes: {mismatch}")
        return vision, text, None
    try:
        int8_cosine = probe_cosine(model, vision, text)
    except Exception as e:  # noqa: BLE001 - onnxruntime's own errors: a graph for other input shapes
        raise OnnxExportError(f"ONNX Runtime cannot run the graphs in {directory}: {e}") from e
    if int8_cosine < plan.min_cosine:
        raise QuantizationError(
            f"--quantize {key.quantization}: the quantized towers' outputs reach cosine {int8_cosine:.5f} to "
            f"float32's on the probe set, below quantize_min_cosine {plan.min_cosine}; serve float32 "
            "(no --quantize) or lower the floor knowingly")
    return vision, text, int8_cosine


def _holds_graphs_of(model: MultimodalModel, key: ExportKey) -> bool:
    return all(isinstance(encoder.graph, OnnxForward) and encoder.graph.key_digest == key.digest()
               for encoder in (model.vision, model.text))


def _row_error(want: torch.Tensor, got: torch.Tensor) -> float:
    """The largest relative L2 error over rows of (B, ...) tensors."""
    want, got = want.float().flatten(1), got.float().flatten(1)  # (B, N) each
    return float(((want - got).norm(dim=1) / want.norm(dim=1).clamp_min(1e-12)).max())


def _probes(model: MultimodalModel, vision: OnnxForward, text: OnnxForward) -> list[tuple]:
    """(tower, graph, torch forward, inputs, real lengths of text rows) of the probe batches."""
    width = model.text.fixed_length or min(16, model.text.max_tokens)
    return [
        ("vision", vision, model.vision.features, vision_example(model.vision, 1, seed=1), None),
        ("vision", vision, model.vision.features, vision_example(model.vision, 3, seed=2), None),
        ("text", text, model.text.encode, text_example(model.text, [width], width, seed=1), [width]),
        ("text", text, model.text.encode,
         text_example(model.text, [width, 1, max(1, width // 2)], width, seed=2), [width, 1, max(1, width // 2)]),
    ]


def probe_cosine(model: MultimodalModel, vision: OnnxForward, text: OnnxForward) -> float:
    """The lowest cosine of the graphs' embeddings to torch's float32 ones over the probe batches
    (``models.onnx.quantize.embedding_cosine``): what int8 gives up."""
    from models.onnx.quantize import embedding_cosine

    cosines = []
    with torch.inference_mode():
        for _, graph, forward, inputs, _ in _probes(model, vision, text):
            want, got = forward(*inputs)[1], graph(*inputs)[1]  # pooled (B, E) each
            cosines.append(float(embedding_cosine(want.float().numpy(), got.float().numpy())))
    return min(cosines)


def probe_mismatch(model: MultimodalModel, vision: OnnxForward, text: OnnxForward,
                   max_relative_error: float = PROBE_MAX_RELATIVE_ERROR) -> str | None:
    """What differs between the graphs and the torch forward on the probe batches; None when they agree."""
    with torch.inference_mode():
        for tower, graph, forward, inputs, lengths in _probes(model, vision, text):
            want = forward(*inputs)
            try:
                got = graph(*inputs)
            except Exception as e:  # noqa: BLE001 - onnxruntime's own errors: a graph for other input shapes
                return f"ONNX Runtime cannot run the {tower} graph on inputs of shape {tuple(inputs[0].shape)}: {e}"
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
