"""How close each CPU runtime gets to the machine's best matrix multiply, on two image towers.

One run, float32 (int8 where named), ``--threads`` intra-op threads each:

1. The ceiling: the best 1024^3 float32 matmul (GFLOP/s) of torch, numpy (in
   a subprocess with ``OPENBLAS_CORETYPE``/``OPENBLAS_L2_SIZE`` unset) and
   ONNX Runtime's ``MatMul``.
2. Batch ``--batch`` of 224 px images through a ViT-B/16-shaped transformers
   CLIP vision tower and timm's ``vit_large_patch16_224`` (random weights), in
   torch eager, ONNX Runtime, ONNX Runtime int8 (``models.onnx.quantize``,
   dynamic) and OpenVINO (f32 held: its default is bf16 on AMX/AVX-512 BF16);
   ``--static-int8`` adds static QDQ int8 for CLIP, the quantizer's alternative.

A tower's rate is its FLOPs (``torch.utils.flop_counter``) over its best
batch time, shown against the best matmul and with the lowest cosine to
torch's embeddings. Runtimes take turns batch by batch (``--repeats``), so a
slower minute of a shared machine hits all of them.

    python -m benchmarks.runtime_rates [--threads 2] [--batch 8] [--repeats 5] [--static-int8]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import machine_line, utc_now
from benchmarks.harness import log as progress_log
from benchmarks.harness.figures import Figure, add_save_figures_argument, save_figures
from benchmarks.harness.table_layout import ruled
from models.onnx.quantize import embedding_cosine, probe_images, quantize_onnx_int8

MATMUL_SIZE = 1024
MATMUL_FLOP = 2 * MATMUL_SIZE**3
IMAGE_SIZE = 224
CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)
OPENBLAS_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8", "amx_tile")

Batch = np.ndarray  # (B, 3, S, S) float32 pixel values
Forward = Callable[[Batch], np.ndarray]  # -> (B, D) embeddings


@dataclass(frozen=True)
class MatmulRate:
    library: str
    gflop_per_s: float


@dataclass(frozen=True)
class TowerRate:
    model: str
    runtime: str
    best_ms: float
    median_ms: float
    gflop_per_s: float
    cosine_to_torch: float


def vector_units() -> str:
    """The CPU's matrix and vector extensions that the runtimes' kernels pick between (``lscpu`` flags)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split())
    except (OSError, IndexError):
        return "unknown"
    return " ".join(flag for flag in VECTOR_FLAGS if flag in flags) or "none of " + " ".join(VECTOR_FLAGS)


def _best_s(run: Callable[[], object], num_runs: int) -> float:
    run()  # warm-up: thread pools, allocations, kernel selection
    best = float("inf")
    for _ in range(num_runs):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def torch_matmul_rate(num_runs: int) -> float:
    a, b = torch.randn(MATMUL_SIZE, MATMUL_SIZE), torch.randn(MATMUL_SIZE, MATMUL_SIZE)
    return MATMUL_FLOP / _best_s(lambda: a @ b, num_runs) / 1e9


_NUMPY_MATMUL = """
import json, sys, time
import numpy as np
a, b = np.random.rand({n}, {n}).astype(np.float32), np.random.rand({n}, {n}).astype(np.float32)
a @ b
best = float("inf")
for _ in range({runs}):
    start = time.perf_counter(); a @ b; best = min(best, time.perf_counter() - start)
print(json.dumps({{"gflop_per_s": {flop} / best / 1e9}}))
"""


def numpy_matmul_rate(num_runs: int, num_threads: int) -> float:
    """numpy's OpenBLAS in a fresh process: its core type and cache size picked by OpenBLAS itself."""
    env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_VARIABLES}
    env.update(OPENBLAS_NUM_THREADS=str(num_threads), OMP_NUM_THREADS=str(num_threads))
    code = _NUMPY_MATMUL.format(n=MATMUL_SIZE, runs=num_runs, flop=MATMUL_FLOP)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["gflop_per_s"])


def _ort_session(path: Path, num_threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = num_threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_matmul_rate(num_runs: int, num_threads: int, scratch: Path) -> float:
    import onnx
    from onnx import TensorProto, helper

    shape = [MATMUL_SIZE, MATMUL_SIZE]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "matmul",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, shape)])
    path = scratch / "matmul.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    session = _ort_session(path, num_threads)
    rng = np.random.default_rng(0)
    inputs = {"a": rng.random(shape, dtype=np.float32), "b": rng.random(shape, dtype=np.float32)}
    return MATMUL_FLOP / _best_s(lambda: session.run(None, inputs), num_runs) / 1e9


def matmul_rates(num_runs: int, num_threads: int, scratch: Path) -> list[MatmulRate]:
    return [MatmulRate("torch", torch_matmul_rate(num_runs)),
            MatmulRate("numpy (OpenBLAS, OPENBLAS_CORETYPE unset)", numpy_matmul_rate(num_runs, num_threads)),
            MatmulRate("ONNX Runtime MatMul", ort_matmul_rate(num_runs, num_threads, scratch))]


class ClipImageEmbeds(torch.nn.Module):
    """transformers' CLIP vision tower with its projection (``model``; default a random ViT-B/16 one): pixels in,
    image embeddings out."""

    def __init__(self, model: torch.nn.Module | None = None) -> None:
        super().__init__()
        from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

        config = CLIPVisionConfig(image_size=IMAGE_SIZE, patch_size=16, hidden_size=768, intermediate_size=3072,
                                  num_hidden_layers=12, num_attention_heads=12, projection_dim=512)
        self.model = model if model is not None else CLIPVisionModelWithProjection(config)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).image_embeds  # (B, 512)


def timm_vit_large() -> torch.nn.Module:
    import timm

    return timm.create_model("vit_large_patch16_224", pretrained=False, num_classes=0)  # pooled (B, 1024)


TOWERS: dict[str, Callable[[], torch.nn.Module]] = {
    "CLIP ViT-B/16 (transformers)": ClipImageEmbeds,
    "ViT-L/16 (timm)": timm_vit_large,
}


def probe_batch(batch_size: int) -> Batch:
    images = probe_images(IMAGE_SIZE, num_images=batch_size)  # (B, S, S, 3) uint8
    pixels = (images.astype(np.float32) / 255.0 - CLIP_MEAN) / CLIP_STD
    return np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))  # (B, 3, S, S)


def tower_flop(tower: torch.nn.Module, batch: Batch) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        tower(torch.from_numpy(batch))
    return counter.get_total_flops()


def export_onnx(tower: torch.nn.Module, batch: Batch, path: Path) -> None:
    torch.onnx.export(tower, (torch.from_numpy(batch),), str(path), input_names=["pixel_values"],
                      output_names=["embeddings"], dynamic_shapes=({0: torch.export.Dim("batch")},),
                      external_data=False)


def quantize_static_int8(src: Path, dst: Path, calibration: Batch) -> None:
    """Static QDQ int8 (uint8 activations, per-channel int8 weights, MinMax): the road not taken."""
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)

    class _Probe(CalibrationDataReader):
        def __init__(self) -> None:
            self._batches = iter([{"pixel_values": calibration}])

        def get_next(self):
            return next(self._batches, None)

    quantize_static(src, dst, _Probe(), quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul", "Gemm"],
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
                    calibrate_method=CalibrationMethod.MinMax)


def ort_forward(path: Path, num_threads: int) -> Forward:
    session = _ort_session(path, num_threads)
    return lambda batch: session.run(None, {"pixel_values": batch})[0]


def openvino_forward(path: Path, num_threads: int) -> Forward:
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", {
        "INFERENCE_NUM_THREADS": num_threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()

    def forward(batch: Batch) -> np.ndarray:
        request.infer({0: batch})
        return request.get_output_tensor(0).data.copy()

    return forward


def torch_forward(tower: torch.nn.Module) -> Forward:
    def forward(batch: Batch) -> np.ndarray:
        with torch.inference_mode():
            return tower(torch.from_numpy(batch)).numpy()

    return forward


def measure_tower(name: str, build: Callable[[], torch.nn.Module], batch: Batch, num_threads: int,
                  num_repeats: int, scratch: Path, static_int8: bool, log: Callable[[str], None]) -> list[TowerRate]:
    torch.manual_seed(0)
    tower = build().eval()
    flop = tower_flop(tower, batch)
    log(f"{name}: {flop / 1e9 / len(batch):.1f} GFLOP per image; exporting")
    fp32_path, int8_path, static_path = (scratch / f"{name}.onnx".replace("/", "_").replace(" ", "_"),
                                         scratch / "int8.onnx", scratch / "static_int8.onnx")
    start = time.perf_counter()
    export_onnx(tower, batch, fp32_path)
    log(f"  exported in {time.perf_counter() - start:.0f} s; quantizing")
    quantize_onnx_int8(fp32_path, int8_path)
    runtimes: dict[str, Forward] = {"torch eager": torch_forward(tower),
                                    "ONNX Runtime": ort_forward(fp32_path, num_threads),
                                    "ONNX Runtime int8 (dynamic)": ort_forward(int8_path, num_threads)}
    if static_int8:
        quantize_static_int8(fp32_path, static_path, batch)
        runtimes["ONNX Runtime int8 (static QDQ)"] = ort_forward(static_path, num_threads)
    try:
        runtimes["OpenVINO (f32)"] = openvino_forward(fp32_path, num_threads)
    except ImportError as e:
        log(f"  OpenVINO not measured: {e}")
    outputs = {runtime: forward(batch) for runtime, forward in runtimes.items()}  # and the warm-up
    times_s: dict[str, list[float]] = {runtime: [] for runtime in runtimes}
    for round_index in range(num_repeats):
        order = list(runtimes) if round_index % 2 == 0 else list(reversed(runtimes))
        for runtime in order:
            start = time.perf_counter()
            runtimes[runtime](batch)
            times_s[runtime].append(time.perf_counter() - start)
        log(f"  round {round_index + 1}/{num_repeats}: "
            + ", ".join(f"{r} {times_s[r][-1] * 1e3:.0f} ms" for r in runtimes))
    rates = []
    for runtime, samples in times_s.items():
        best_s = min(samples)
        rates.append(TowerRate(name, runtime, best_s * 1e3, float(np.median(samples)) * 1e3, flop / best_s / 1e9,
                               embedding_cosine(outputs["torch eager"], outputs[runtime])))
    for path in scratch.iterdir():
        path.unlink()
    return rates


def matmul_table(matmuls: list[MatmulRate]) -> str:
    """Each library's matmul rate and its share of the best: the ceiling a tower's rate is read against."""
    best = max(m.gflop_per_s for m in matmuls)
    return ruled([("1024^3 matmul, fp32", "GFLOP/s", "of best")]
                 + [(m.library, f"{m.gflop_per_s:.0f}", f"{m.gflop_per_s / best:.2f}") for m in matmuls])


def format_report(matmuls: list[MatmulRate], towers: list[TowerRate], batch_size: int) -> str:
    best = max(m.gflop_per_s for m in matmuls)
    tower_rows = [("tower, batch " + str(batch_size), "runtime", "best ms", "median ms", "GFLOP/s",
                   "/ best matmul", "cosine to torch", "x torch", "x ORT fp32")]
    for rate in towers:
        same = {t.runtime: t for t in towers if t.model == rate.model}
        tower_rows.append((rate.model, rate.runtime, f"{rate.best_ms:.0f}", f"{rate.median_ms:.0f}",
                           f"{rate.gflop_per_s:.0f}", f"{rate.gflop_per_s / best:.2f}",
                           f"{rate.cosine_to_torch:.7f}",
                           f"{same['torch eager'].best_ms / rate.best_ms:.2f}",
                           f"{same['ONNX Runtime'].best_ms / rate.best_ms:.2f}"))
    return matmul_table(matmuls) + "\n\n" + ruled(tower_rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5, help="rounds of one batch per runtime, alternated")
    parser.add_argument("--matmul-runs", type=int, default=20)
    parser.add_argument("--towers", nargs="+", choices=sorted(TOWERS), default=list(TOWERS))
    parser.add_argument("--static-int8", action="store_true", help="also static QDQ int8 on the CLIP tower")
    add_save_figures_argument(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    versions = _versions()
    print(f"runtime rates, {utc_now()}, {machine_line()}", flush=True)
    print(f"vector units: {vector_units()}; {versions}; {args.threads} threads per runtime, batch {args.batch}",
          flush=True)
    log = functools.partial(progress_log, file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="runtime_rates_") as directory:
        scratch = Path(directory)
        matmuls = matmul_rates(args.matmul_runs, args.threads, scratch)
        log("matmul: " + ", ".join(f"{m.library} {m.gflop_per_s:.0f}" for m in matmuls))
        batch = probe_batch(args.batch)
        towers = []
        for name in args.towers:
            towers += measure_tower(name, TOWERS[name], batch, args.threads, args.repeats, scratch,
                                    args.static_int8 and name.startswith("CLIP"), log)
            gc.collect()
    print(format_report(matmuls, towers, args.batch))
    save_figures(args.save_figures, headline_figures(towers))


def headline_figures(towers: list[TowerRate]) -> list[Figure]:
    """Per tower, ONNX Runtime fp32 and dynamic int8 over torch eager (best batch), rounded as the table prints."""
    figures = []
    for rate in towers:
        torch_ms = next(t.best_ms for t in towers if t.model == rate.model and t.runtime == "torch eager")
        label = {"ONNX Runtime": "ORT fp32", "ONNX Runtime int8 (dynamic)": "ORT int8"}.get(rate.runtime)
        if label is not None:
            cosine = f" (cosine {rate.cosine_to_torch:.7f})" if label == "ORT int8" else ""
            figures.append(Figure("ort_vs_torch", f"{rate.model.split(' (')[0]} {label} x torch{cosine}",
                                  round(torch_ms / rate.best_ms, 2), ""))
    return figures


def _versions() -> str:
    import onnxruntime

    try:
        import openvino

        openvino_version = openvino.__version__
    except ImportError:
        openvino_version = "not installed"
    return f"onnxruntime {onnxruntime.__version__}, openvino {openvino_version}, numpy {np.__version__}"


if __name__ == "__main__":
    main()
