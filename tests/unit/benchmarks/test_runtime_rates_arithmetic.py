"""benchmarks.runtime_rates: the ratios its table prints and the FLOPs it divides by."""

from __future__ import annotations

import pytest
import torch

from benchmarks.runtime_rates import MatmulRate, TowerRate, format_report, probe_batch, tower_flop


def _row(report: str, *cells: str) -> list[str]:
    for line in report.splitlines():
        if all(cell in line for cell in cells):
            return line.split()
    raise AssertionError(f"no row with {cells} in:\n{report}")


def test_rates_are_shown_against_the_best_matmul_and_the_same_towers_torch_and_ort():
    matmuls = [MatmulRate("torch", 200.0), MatmulRate("numpy", 500.0), MatmulRate("ORT", 400.0)]
    towers = [TowerRate("vit", "torch eager", 1000.0, 1100.0, 150.0, 1.0),
              TowerRate("vit", "ONNX Runtime", 400.0, 420.0, 375.0, 0.9999999),
              TowerRate("vit", "int8", 250.0, 260.0, 600.0, 0.9998)]
    report = format_report(matmuls, towers, batch_size=8)
    assert _row(report, "numpy")[-1] == "1.00" and _row(report, "torch", "200")[-1] == "0.40"
    ort = _row(report, "vit", "ONNX Runtime")
    assert ort[-4:] == ["0.75", "0.9999999", "2.50", "1.00"]  # 375/500 of the best matmul; 1000/400 ms
    assert _row(report, "vit", "int8")[-4:] == ["1.20", "0.9998000", "4.00", "1.60"]


def test_flops_of_a_linear_layer_are_counted():
    layer = torch.nn.Linear(16, 4, bias=False)
    batch = probe_batch(2)  # (2, 3, 224, 224)

    class Flatten(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return layer(x.reshape(-1, 16))  # (2 * 3 * 224 * 224 / 16, 4)

    assert batch.shape == (2, 3, 224, 224)
    assert tower_flop(Flatten(), batch) == pytest.approx(2 * (batch.size // 16) * 16 * 4)


def test_the_headline_figures_are_each_towers_onnx_runtime_rates_over_torch():
    from benchmarks.runtime_rates import headline_figures

    towers = [TowerRate("ViT-L/16 (timm)", "torch eager", 32947.0, 33083.0, 29.0, 1.0),
              TowerRate("ViT-L/16 (timm)", "ONNX Runtime", 38330.0, 39133.0, 25.0, 1.0),
              TowerRate("ViT-L/16 (timm)", "ONNX Runtime int8 (dynamic)", 12799.0, 13512.0, 75.0, 0.9990847),
              TowerRate("ViT-L/16 (timm)", "OpenVINO (f32)", 29911.0, 36003.0, 32.0, 1.0)]
    assert [(f.name, f.value) for f in headline_figures(towers)] == [
        ("ViT-L/16 ORT fp32 x torch", 0.86), ("ViT-L/16 ORT int8 x torch (cosine 0.9990847)", 2.57)]
