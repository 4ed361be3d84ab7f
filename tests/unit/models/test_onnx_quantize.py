"""int8 quantization of an exported tower: the graph really is int8, and its embeddings stay close.

The tower is a small random transformers ``CLIPVisionModelWithProjection``
built with the library's own constructors, exported with ``torch.onnx.export``
(float32 pixel values in, image embeddings out), quantized with
``models.onnx.quantize``, and run in ONNX Runtime on the fixed probe images.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

from models.onnx.quantize import (INT8_OP_TYPES, PROBE_TEXTS, embedding_cosine, graph_op_types, is_int8_graph,
                                  probe_images, quantize_onnx_int8)

IMAGE_SIZE = 32
MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)
MIN_INT8_COSINE = 0.99  # the serving floor's default (issue 43's quantize_min_cosine)


class _ImageEmbeds(torch.nn.Module):
    def __init__(self, model: CLIPVisionModelWithProjection) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).image_embeds  # (B, P)


def _pixel_values(images: np.ndarray) -> np.ndarray:
    """(N, S, S, 3) uint8 -> (N, 3, S, S) float32, normalised as CLIP's processor does."""
    return np.ascontiguousarray(((images.astype(np.float32) / 255.0 - MEAN) / STD).transpose(0, 3, 1, 2))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    config = CLIPVisionConfig(image_size=IMAGE_SIZE, patch_size=8, hidden_size=64, intermediate_size=256,
                              num_hidden_layers=2, num_attention_heads=4, projection_dim=32)
    tower = _ImageEmbeds(CLIPVisionModelWithProjection(config)).eval()
    path = tmp_path_factory.mktemp("onnx") / "vision.onnx"
    example = torch.from_numpy(_pixel_values(probe_images(IMAGE_SIZE, num_images=2)))
    torch.onnx.export(tower, (example,), str(path), input_names=["pixel_values"], output_names=["image_embeds"],
                      dynamic_shapes=({0: torch.export.Dim("batch")},))
    return path, tower


def _run(path: Path, pixel_values: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"pixel_values": pixel_values})[0]


def test_int8_graph_is_quantized_and_close_to_float32(exported, tmp_path: Path):
    fp32_path, tower = exported
    int8_path = tmp_path / "cache" / "vision.int8.onnx"
    quantize_onnx_int8(fp32_path, int8_path)

    fp32_ops, int8_ops = graph_op_types(fp32_path), graph_op_types(int8_path)
    assert not fp32_ops & INT8_OP_TYPES and not is_int8_graph(fp32_path)
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= int8_ops and is_int8_graph(int8_path)
    assert sorted(p.name for p in int8_path.parent.iterdir()) == ["vision.int8.onnx"]  # no temporary left over

    pixel_values = _pixel_values(probe_images(IMAGE_SIZE))
    with torch.no_grad():
        reference = tower(torch.from_numpy(pixel_values)).numpy()
    fp32 = _run(fp32_path, pixel_values)
    int8 = _run(int8_path, pixel_values)
    assert embedding_cosine(reference, fp32) >= 0.99999
    int8_cosine = embedding_cosine(reference, int8)
    print(f"int8 cosine to torch: {int8_cosine:.6f}")
    assert MIN_INT8_COSINE <= int8_cosine < 0.99999  # close, but the arithmetic did change
    assert np.abs(int8 - fp32).max() > 1e-5


def test_quantizing_leaves_the_float32_graph_alone(exported, tmp_path: Path):
    fp32_path, _ = exported
    before = fp32_path.read_bytes()
    quantize_onnx_int8(fp32_path, tmp_path / "int8.onnx")
    assert fp32_path.read_bytes() == before


def test_embedding_cosine_is_the_worst_row():
    reference = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    candidate = np.array([[5.0, 0.0], [1.0, 1.0], [3.0, 4.0]], dtype=np.float32)  # rows 0 and 2 same direction
    assert embedding_cosine(reference, candidate) == pytest.approx(np.sqrt(0.5), abs=1e-12)
    assert embedding_cosine(reference, reference * 7.0) == pytest.approx(1.0, abs=1e-12)
    assert embedding_cosine(reference, -reference) == pytest.approx(-1.0, abs=1e-12)
    assert embedding_cosine(np.zeros((2, 3)), np.zeros((2, 3))) == 1.0
    assert embedding_cosine(np.array([[0.0, 0.0]]), np.array([[1.0, 0.0]])) == 0.0
    with pytest.raises(ValueError, match="different shapes"):
        embedding_cosine(reference, candidate[:2])


def test_probe_set_is_fixed_and_photo_like():
    images = probe_images(48)
    assert images.shape == (8, 48, 48, 3) and images.dtype == np.uint8
    assert np.array_equal(images, probe_images(48))  # the same bytes every call
    assert not np.array_equal(images[0], images[1])
    assert images.min() < 40 and images.max() > 215  # dark disc, bright rectangle: a real range to quantize
    assert len(set(PROBE_TEXTS)) == len(PROBE_TEXTS) >= 8


def test_the_quantizers_per_tensor_lines_stay_out_of_the_log(exported, tmp_path: Path, caplog):
    caplog.set_level(logging.DEBUG)
    quantize_onnx_int8(exported[0], tmp_path / "int8.onnx")
    from_quantizer = [record for record in caplog.records if "/onnxruntime/quantization/" in record.pathname]
    assert not from_quantizer, [record.getMessage() for record in from_quantizer[:3]]
    logging.getLogger().info("after quantizing")  # the root logger's filter is gone again
    assert caplog.records[-1].getMessage() == "after quantizing"


def test_the_quantizers_lines_stay_out_of_a_serving_processs_log(exported, tmp_path: Path, caplog, monkeypatch):
    """``server.runtime.log_output`` turns off the caller lookup: records carry no pathname to tell the quantizer by."""
    monkeypatch.setattr(logging, "_srcfile", None)
    caplog.set_level(logging.DEBUG)
    quantize_onnx_int8(exported[0], tmp_path / "int8.onnx")
    from_quantizer = [record.getMessage() for record in caplog.records if record.name == "root"]
    assert not from_quantizer, from_quantizer[:3]
