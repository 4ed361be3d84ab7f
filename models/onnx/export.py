"""Each tower's served forward as an ONNX graph (``torch.onnx.export``, torch's dynamo exporter).

What is exported is exactly what the torch runtime computes between the
uint8 normalisation and the fusion head, the method the encoder's ``graph``
seam stands in for (``models.graphs``, ``models.cuda_graphs`` use the same):

    tower    method                      inputs                                   outputs
    vision   UInt8VisionEncoder.features pixels (B, 3, S, S) float32, normalised   tokens (B, Lv, d_v), pooled (B, E_v)
    text     TextEncoder.encode          input_ids, attention_mask (B, Lt) int64   tokens (B, Lt, d_t), pooled (B, E_t)

The batch axis is dynamic, and so is the text length unless the tower takes
one fixed length (SigLIP, OpenCLIP). The text example has a padded row:
transformers drops an all-ones attention mask in Python, so an example
without padding would record the branch that ignores it (as ``models.graphs``
explains for TorchScript). Weights are written as ONNX external data beside
the graph (``<tower>.onnx.data``), which a graph over 2 GiB needs anyway.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from models.errors import OnnxExportError
from models.text import TextEncoder
from models.vision import UInt8VisionEncoder

OPSET = 18  # ONNX opset of the exported graphs: part of the export cache key
VISION_INPUTS = ("pixels",)
TEXT_INPUTS = ("input_ids", "attention_mask")
OUTPUTS = ("tokens", "pooled")
EXAMPLE_BATCH = 2


class _VisionForward(nn.Module):
    """``UInt8VisionEncoder.features`` as a module with named inputs: what ``torch.onnx.export`` takes."""

    def __init__(self, encoder: UInt8VisionEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder.features(pixels)


class _TextForward(nn.Module):
    """``TextEncoder.encode`` as a module with named inputs."""

    def __init__(self, encoder: TextEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder.encode(input_ids, attention_mask)


def _root_cause(error: BaseException) -> str:
    """The innermost cause's first line: the exporter wraps what failed in several layers of advice."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def vision_example(encoder: UInt8VisionEncoder, batch_size: int, seed: int = 0) -> tuple[torch.Tensor]:
    """Normalised pixels (B, 3, S, S) in [-1, 1], float32 on the CPU."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch_size, 3, encoder.input_size, encoder.input_size)
    return (torch.rand(shape, generator=generator).mul(2).sub(1),)  # (B, 3, S, S)


def text_example(encoder: TextEncoder, lengths: list[int], width: int,
                 seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (B, width) with each row's real length from ``lengths``, right-padded, int64 on the CPU."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, encoder.vocab_size, (len(lengths), width), generator=generator)  # (B, Lt)
    attention_mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, Lt)
    return input_ids, attention_mask


def text_example_width(encoder: TextEncoder) -> int:
    return encoder.fixed_length or min(8, encoder.max_tokens)


# The exporter's libraries log each pass at INFO (rewrites applied, initializers merged): not the operator's news.
_CHATTY_LOGGERS = ("onnx_ir", "onnxscript", "torch.onnx", "torch.export", "torch._dynamo", "torch.fx",
                   "torch._export", "torch.utils._sympy")


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _CHATTY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecation and tracer chatter; the probe check decides
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _export(module: nn.Module, example: tuple[torch.Tensor, ...], input_names: tuple[str, ...],
            dynamic_shapes: dict[str, dict[int, object]], path: Path) -> None:
    try:
        with torch.no_grad(), _quiet_exporter():
            torch.onnx.export(module.eval(), example, str(path), dynamo=True, input_names=list(input_names),
                              output_names=list(OUTPUTS), dynamic_shapes=dynamic_shapes, opset_version=OPSET,
                              external_data=True, optimize=True, verbose=False, report=False)
    except Exception as e:  # noqa: BLE001 - any model may fail to export; the caller falls back or exits
        raise OnnxExportError(f"torch.onnx.export failed for the {path.stem} tower: {_root_cause(e)}") from e


def export_vision(encoder: UInt8VisionEncoder, path: Path) -> None:
    """Write ``encoder.features`` as ``path`` (+ ``path.data``), batch axis dynamic."""
    batch = torch.export.Dim("batch", min=1, max=4096)
    _export(_VisionForward(encoder), vision_example(encoder, EXAMPLE_BATCH), VISION_INPUTS,
            {"pixels": {0: batch}}, path)


def export_text(encoder: TextEncoder, path: Path) -> None:
    """Write ``encoder.encode`` as ``path`` (+ ``path.data``), batch axis (and length, unless fixed) dynamic."""
    width = text_example_width(encoder)
    example = text_example(encoder, [width, max(1, width - 3)], width)
    batch = torch.export.Dim("batch", min=1, max=4096)
    axes: dict[int, object] = {0: batch}
    if encoder.fixed_length is None:
        axes[1] = torch.export.Dim("length", min=1, max=encoder.max_tokens)
    _export(_TextForward(encoder), example, TEXT_INPUTS,
            {"input_ids": dict(axes), "attention_mask": dict(axes)}, path)
