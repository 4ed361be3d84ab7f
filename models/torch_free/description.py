"""What clients are told about the served model: built by the engine, sent to every API process as it is."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelDescription:
    """What clients are told about the served model, in every answer and in ``/v1/models``."""

    name: str
    fingerprint: str
    family: str  # "mmserve", "siglip", "clip", "open_clip"
    score: str | None  # the ``score`` an answer carries (``models.scores.ScoreKind``); None: no score
    normalized_embeddings: bool
    fusion_head: str  # "trained" (``match_score`` served) or "untrained" (no ``match_score``)
    dtype: str = "float32"  # what the model computes in (``models.precision``); answers are float32 numbers
    runtime: str = "torch"  # what runs the towers: "torch" or "onnxruntime" (``models.onnx``)
    quantization: str = "none"  # "int8": the towers' matrix multiplies in int8 (``--quantize``)
    int8_cosine: float | None = None  # int8: the lowest cosine of int8 to float32 outputs measured at start-up
