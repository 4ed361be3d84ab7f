"""The figures two entry points save for the headline are the ones their tables judge (``--save-figures``)."""

from __future__ import annotations

from benchmarks.grpc_vs_http import _figures as grpc_figures
from benchmarks.runtime_rates import MatmulRate
from benchmarks.served_tower_rates import ServedRate, rate_figures


def test_the_tower_rate_share_is_the_median_batch_over_the_best_matmul_of_the_run():
    matmuls = [MatmulRate("torch", 100.0), MatmulRate("onnxruntime", 125.0)]
    rate = ServedRate("ViT-L/16", "onnxruntime float32", gflop_per_batch=500.0, median_batch_ms=5000.0,
                      best_batch_ms=4000.0)  # 100 GFLOP/s at the median: 0.8 of the best matmul, the target
    figures = {figure.name: figure.value for figure in rate_figures(matmuls, [rate])}
    assert figures["best 1024^3 matmul of the run"] == 125
    assert figures["ViT-L/16, batch 8, onnxruntime float32, median batch"] == 100
    assert figures["ViT-L/16, median batch over the best matmul (target >= 0.8, met)"] == 0.8
    slower = ServedRate("ViT-L/16", "torch float32", 500.0, median_batch_ms=10_000.0, best_batch_ms=9000.0)
    assert [f.value for f in rate_figures(matmuls, [slower]) if "NOT met" in f.name] == [0.4]


def test_grpc_figures_carry_the_ratio_and_the_verdict_the_table_prints():
    figures = grpc_figures("tiny CLIP", "text", rps_ratio=1.034, cpu_ratio=0.812)
    assert [(f.name, f.value) for f in figures] == [
        ("tiny CLIP text, answered/s gRPC over HTTP (target >= 1.00, met)", 1.03),
        ("tiny CLIP text, server CPU per request (target <= 0.80, MISSED)", 0.81)]
    assert all(f.row == "grpc_vs_http" and f.unit == "x" for f in figures)
