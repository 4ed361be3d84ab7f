"""int8 towers for ONNX Runtime: the quantized graph, and how far its embeddings moved.

``quantize_onnx_int8`` rewrites an exported tower's matrix multiplies
(``MatMul`` and ``Gemm``, where a transformer tower spends nearly all its
FLOPs) to 8-bit integer arithmetic with ONNX Runtime's own quantizer; every
other operator (layer norm, softmax, GELU, the patch convolution) stays float32.

    float32 graph                              int8 graph (dynamic)
    x ──> MatMul(W fp32) ──> y                 x ──> DynamicQuantizeLinear ──> (x_u8, scale, zero point)
                                                 ──> MatMulInteger(x_u8, W_s8) ──> Cast, Mul(scales) ──> y
                                               (ORT fuses the tail into MatMulIntegerToFloat)

Dynamic quantization with per-channel int8 weights, measured (BENCHMARKS.md,
"ONNX Runtime vs torch on the CPU"; ViT-B/16-shaped transformers CLIP and timm ViT-L/16
vision towers, random weights, batch 8, 2 threads, on a shared 2-core Intel
Xeon with AVX-512 VNNI and AMX, under heavy load from other tests):

- Dynamic beats static. On the CLIP tower dynamic ran 1.94x (per-tensor
  weights) and 2.36x (per-channel) ONNX Runtime float32 at cosine 0.99983 and
  0.99987 to torch, static QDQ (uint8 activations, per-channel weights, MinMax
  calibration on the probe images) 1.67x and 1.64x at 0.99980; static with
  int8 activations fell off ORT's fast path (3.4x dynamic's time in an earlier
  trial). Static quantization fixes each
  activation's scale from calibration inputs, which an engine would have to
  ship per family and which a transformer's outlier activations (attention
  output, the MLP after GELU) make fragile: one fixed range either clips them
  or wastes the 8 bits. Dynamic quantization measures each activation's range
  per batch (one cheap pass beside the matrix multiply) and quantizes any
  family's tower with the same call, no calibration set.
- Per-channel weights, not per-tensor. Per-tensor weights ran ViT-L/16 2.79x
  float32 but at cosine 0.955, below the serving floor (``quantize_min_cosine``,
  0.99): one scale per weight matrix, set by its largest entry, leaves its
  smaller output columns few of the 256 levels, and the error compounds over
  ViT-L's 24 blocks. Per-channel weights (one scale per output column) on the
  same graph and batch: cosine 0.9991 (CLIP 0.99987 against 0.99982). Their
  cost is within the noise: one-batch trials had them at 1.16-1.34x
  per-tensor's time, while the benchmark run after the change had them at
  2.36x (CLIP) and 2.99x (ViT-L) float32's speed, against per-tensor's 1.94x
  and 2.79x in the run before.

ORT's u8s8 kernels use VNNI / AMX where the CPU has them; without VNNI (plain
AVX2 or AVX-512) they run slower and u8s8 products can saturate, which shows
up as a lower cosine, and the serving engine's probe check is what catches it.

``embedding_cosine`` is that check's measure: the lowest cosine between a row
of the float32 embeddings and the same row of the int8 ones. ``probe_images``
and ``PROBE_TEXTS`` are the fixed, deterministic probe inputs it is computed on.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

QUANTIZED_OP_TYPES: tuple[str, ...] = ("MatMul", "Gemm")
# Ops that only an int8 graph holds: what a test (or a cache check) looks for to tell it from float32.
INT8_OP_TYPES: frozenset[str] = frozenset(
    {"DynamicQuantizeLinear", "MatMulInteger", "MatMulIntegerToFloat", "QLinearMatMul", "DynamicQuantizeMatMul"})
# Above this the protobuf limit forces ONNX external data (a SigLIP-so400m-class tower in float32).
_PROTOBUF_LIMIT_BYTES = 2 * 1024**3
PROBE_SEED = 20261205
NUM_PROBE_IMAGES = 8
PROBE_TEXTS: tuple[str, ...] = (
    "a photo of a cat",
    "two dogs playing in the snow",
    "a red car parked next to a tree",
    "a bowl of fruit on a wooden table",
    "an aerial view of a city at night",
    "a handwritten note",
    "一只猫坐在窗台上",
    "a close-up of a person's face, smiling",
)


def _graph_bytes(path: Path) -> int:
    """The graph and any external-data files beside it (``model.onnx`` + ``model.onnx.data``)."""
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())


def quantize_onnx_int8(src_path: Path, dst_path: Path) -> None:
    """Write ``src_path``'s float32 graph with its MatMul/Gemm weights in int8 (dynamic, per channel) to ``dst_path``.

    The result is written beside ``dst_path`` under a temporary name and moved
    into place with one rename, so a reader never sees half a graph. The
    float32 graph at ``src_path`` is not changed.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src_path, dst_path = Path(src_path), Path(dst_path)
    dst_path.parent.mkdir(parents=True, exist_ok=True)
    use_external_data = _graph_bytes(src_path) > _PROTOBUF_LIMIT_BYTES
    handle, temporary = tempfile.mkstemp(prefix=f".{dst_path.name}.", suffix=".onnx", dir=dst_path.parent)
    os.close(handle)
    try:
        with _quantizer_lines_dropped():
            quantize_dynamic(
                src_path, temporary,
                op_types_to_quantize=list(QUANTIZED_OP_TYPES),
                per_channel=True,
                weight_type=QuantType.QInt8,
                use_external_data_format=use_external_data,
                # MatMulConstBOnly: quantize only products with a weight (constant) operand; attention's
                # Q @ K^T and P @ V take two activations, and quantizing both sides costs cosine for little time.
                extra_options={"MatMulConstBOnly": True},
            )
        if use_external_data:
            # The external data file is named after the temporary graph; one ``os.replace`` per file would
            # leave a window, so a graph this large is re-saved under its final name by onnx instead.
            _resave_with_external_data(Path(temporary), dst_path)
        else:
            os.replace(temporary, dst_path)
    finally:
        for leftover in Path(temporary).parent.glob(Path(temporary).name + "*"):
            leftover.unlink(missing_ok=True)


def _resave_with_external_data(temporary: Path, dst_path: Path) -> None:
    import onnx

    model = onnx.load(str(temporary), load_external_data=True)
    staged = dst_path.with_name(f".{dst_path.name}.staged")
    onnx.save_model(model, str(staged), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=dst_path.name + ".data")
    # The data file already has its final name (``location``); the graph that points at it moves last.
    os.replace(staged, dst_path)


def graph_op_types(path: Path) -> frozenset[str]:
    """The operator types a graph holds (its weights are not read)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return frozenset(node.op_type for node in model.graph.node)


def is_int8_graph(path: Path) -> bool:
    return bool(graph_op_types(path) & INT8_OP_TYPES)


def embedding_cosine(reference: np.ndarray, candidate: np.ndarray) -> float:
    """The lowest cosine similarity between a row of ``reference`` and the same row of ``candidate``.

    Both are (N, D) embeddings of the same N inputs (any other leading shape
    is flattened to rows). Computed in float64, so the float32 rounding of
    the embeddings themselves does not show up as a difference. A zero row
    against a non-zero one has cosine 0; two zero rows count as equal.
    """
    if reference.shape != candidate.shape:
        raise ValueError(f"embeddings of different shapes: {reference.shape} and {candidate.shape}")
    if reference.size == 0:
        raise ValueError("no embeddings to compare")
    ref = reference.reshape(-1, reference.shape[-1]).astype(np.float64)  # (N, D)
    cand = candidate.reshape(-1, candidate.shape[-1]).astype(np.float64)  # (N, D)
    ref_norm = np.linalg.norm(ref, axis=1)  # (N,)
    cand_norm = np.linalg.norm(cand, axis=1)  # (N,)
    both_zero = (ref_norm == 0) & (cand_norm == 0)
    denominator = np.where(ref_norm * cand_norm > 0, ref_norm * cand_norm, 1.0)
    cosines = np.where(both_zero, 1.0, (ref * cand).sum(axis=1) / denominator)  # (N,)
    return float(np.clip(cosines, -1.0, 1.0).min())


def probe_images(size: int, num_images: int = NUM_PROBE_IMAGES, seed: int = PROBE_SEED) -> np.ndarray:
    """``num_images`` fixed (S, S, 3) uint8 images, S = ``size``: the same bytes on every machine and run.

    Photo-like rather than white noise (an int8 graph's error depends on the
    activations' range): a smooth colour field from a few random low
    frequencies, a bright rectangle and a dark disc (edges), and mild grain.
    """
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size].astype(np.float64) / size  # (S, S) each
    images = np.empty((num_images, size, size, 3), dtype=np.uint8)
    for index in range(num_images):
        frequencies = rng.uniform(0.5, 3.0, (3, 2))  # per channel: (fy, fx)
        phases = rng.uniform(0, 2 * np.pi, 3)
        field = np.stack([np.sin(2 * np.pi * (f[0] * y + f[1] * x) + p) for f, p in zip(frequencies, phases)],
                         axis=-1)  # (S, S, 3)
        image = 127.5 + 80.0 * field
        top, left = rng.integers(0, size // 2, 2)
        image[top: top + size // 3, left: left + size // 4] = rng.uniform(180, 255, 3)
        cy, cx, radius = rng.uniform(0.25, 0.75), rng.uniform(0.25, 0.75), rng.uniform(0.1, 0.25)
        image[(y - cy) ** 2 + (x - cx) ** 2 < radius ** 2] = rng.uniform(0, 60, 3)
        image += rng.normal(0.0, 6.0, image.shape)
        images[index] = np.clip(np.rint(image), 0, 255).astype(np.uint8)
    return images


class _DropQuantizerLines(logging.Filter):
    """The quantizer's lines: made by the module-level ``logging.info``/``warning`` calls, so on the root logger.

    Told apart by logger name, not by ``pathname``: a serving process's logging
    (``server.runtime.log_output``) skips the caller lookup, and every record's
    pathname is then ``(unknown file)``. mmserve itself never logs on the root logger.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != "root" and "/onnxruntime/quantization/" not in record.pathname.replace(os.sep, "/")


@contextmanager
def _quantizer_lines_dropped() -> Iterator[None]:
    """ONNX Runtime's quantizer logs a line per tensor and per skipped product on the root logger (INFO and a
    pre-processing hint at WARNING): at start-up a user could act on none of them. Dropped while it runs."""
    root = logging.getLogger()
    dropped = _DropQuantizerLines()
    root.addFilter(dropped)
    try:
        yield
    finally:
        root.removeFilter(dropped)
